//! The JSON shape of a request, checked before typed decoding.
//!
//! serde decodes a struct from a JSON array as well as from an object (its sequence form:
//! fields by position). The protocol promises neither: every request line is one JSON object
//! and `params` an object (docs/protocol.md, `protocol.schema.json`), so a client can never
//! come to depend on a field order the schema does not define. These checks keep the typed
//! decoders to objects.

use serde_json::Value;

/// What a JSON value is, as an error message names it (`"an array"`).
pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Why a request line is not one JSON object, or `None` when it starts like one (its first
/// byte after JSON whitespace is `{`, so serde can only decode it as a map). A line that is
/// not JSON at all is also `None`: serde's own error says more about it.
pub(super) fn envelope_problem(line: &[u8]) -> Option<String> {
    let first = line
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))?;
    if *first == b'{' {
        return None;
    }
    let value = serde_json::from_slice::<Value>(line).ok()?;
    Some(format!(
        "a request must be one JSON object with version, id, method and params, got {}",
        kind(&value)
    ))
}

/// Why `params` is not an object, or `None` when it is one or absent (`null` included: the
/// method's own decoding says whether it needs params).
pub(super) fn params_problem(params: Option<&Value>) -> Option<String> {
    match params {
        None | Some(Value::Null | Value::Object(_)) => None,
        Some(other) => Some(format!("params must be a JSON object, got {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_objects_pass() {
        assert_eq!(envelope_problem(br#" {"version":1}"#), None);
        assert_eq!(envelope_problem(b"not json"), None, "serde says why");
        assert_eq!(envelope_problem(b""), None);
        assert!(envelope_problem(b"\t[1,2]")
            .unwrap()
            .ends_with("got an array"));
        assert!(envelope_problem(b"null").unwrap().ends_with("got null"));
        assert_eq!(params_problem(None), None);
        assert_eq!(params_problem(Some(&json!({"uid": "a"}))), None);
        assert_eq!(params_problem(Some(&Value::Null)), None);
        assert_eq!(
            params_problem(Some(&json!(["a"]))).unwrap(),
            "params must be a JSON object, got an array"
        );
        assert!(params_problem(Some(&json!(1)))
            .unwrap()
            .ends_with("a number"));
    }
}
