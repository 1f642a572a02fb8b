//! A claim document, JSON or YAML, read into a JSON value.

use serde_json::Value;

use crate::config::ConfigError;

/// Parses a claim document that is JSON or YAML into a JSON value.
///
/// JSON is tried first (its error messages are better); YAML (through `serde_norway`) second.
/// When both fail the message of the parser that fits the text best is returned. Refusals carry
/// `InvalidRequest`.
pub fn parse_claim_document(text: &str) -> Result<Value, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::invalid_request(
            "claim document is empty (expected a ResourceClaim in JSON or YAML)",
        ));
    }
    let json_err = match serde_json::from_str::<Value>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match serde_norway::from_str::<serde_norway::Value>(text) {
        Ok(v) => {
            // JSON has no NaN or infinity: converted, they would turn into null and read as
            // "field absent", silently dropping what the user wrote.
            if let Some(path) = non_finite_number(&v, String::new()) {
                return Err(ConfigError::invalid_request(format!(
                    "claim document: {path}: not a finite number"
                )));
            }
            serde_json::to_value(v).map_err(|e| {
                ConfigError::invalid_request(format!("claim document cannot be read as JSON: {e}"))
            })
        }
        Err(yaml_err) => {
            let looks_like_json = text.trim_start().starts_with(['{', '[']);
            Err(ConfigError::invalid_request(if looks_like_json {
                format!("claim document is not valid JSON: {json_err}")
            } else {
                format!("claim document is not valid YAML: {yaml_err}")
            }))
        }
    }
}

/// The path of the first NaN or infinite number in a YAML document, if any.
fn non_finite_number(v: &serde_norway::Value, path: String) -> Option<String> {
    use serde_norway::Value as Y;
    match v {
        Y::Number(n) if n.is_nan() || n.is_infinite() => Some(if path.is_empty() {
            "(document)".into()
        } else {
            path
        }),
        Y::Sequence(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| non_finite_number(item, format!("{path}[{i}]"))),
        Y::Mapping(map) => map.iter().find_map(|(k, item)| {
            let key = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
            let child = if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            };
            non_finite_number(item, child)
        }),
        Y::Tagged(t) => non_finite_number(&t.value, path),
        _ => None,
    }
}
