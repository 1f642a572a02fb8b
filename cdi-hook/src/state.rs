//! The OCI container state a runtime writes to a hook's stdin, and its validation.
//!
//! Pure: bytes in, a validated [`OciState`] or a [`StateError`] out. Nothing here touches the
//! process's stdin or the daemon, so every rule is unit-tested on its own.
//!
//! The state is parsed field by field (rather than straight into a struct) for two reasons:
//! a truncated or malformed document can still be reported by the last field that was read,
//! and `detach` can still find the container's `id` in a state that breaks later on.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde_json::{Map, Value};

/// Largest state accepted on stdin. A real state is well under a kilobyte (annotations make up
/// most of it); the cap keeps a runaway writer from making the hook buffer without bound.
pub const MAX_STATE_BYTES: usize = 1024 * 1024;

/// Longest rendering of an offending value in an error message, so one bad field cannot turn
/// the single stderr line the runtime shows to users into a wall of text.
const MAX_SHOWN_VALUE_CHARS: usize = 64;

/// The parts of the OCI state (runtime-spec `runtime.md`, "State") the hook relies on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciState {
    /// `ociVersion`: the runtime-spec version the runtime follows.
    pub oci_version: String,
    /// `id`: the container id, unique on this host.
    pub id: String,
    /// `status`: `creating` at `createRuntime`, `stopped` at `poststop`.
    pub status: String,
    /// `pid`: host PID of the container's init process (as seen from the hook's namespace).
    pub pid: i32,
    /// `bundle`: absolute path of the container's bundle directory.
    pub bundle: String,
    /// `annotations`: the container's annotations (empty when absent).
    pub annotations: BTreeMap<String, String>,
}

/// Why the state on stdin cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Nothing but whitespace arrived.
    #[error("no OCI state on stdin (it is empty)")]
    Empty,
    /// More than [`MAX_STATE_BYTES`] arrived.
    #[error("OCI state on stdin is larger than {limit} bytes")]
    TooLarge {
        /// The cap that was exceeded.
        limit: usize,
    },
    /// The document ends before it is complete.
    #[error("OCI state on stdin is truncated{}", AfterField(.last_field.as_deref(), "ends in"))]
    Truncated {
        /// The last top-level field whose name was read, if any.
        last_field: Option<String>,
    },
    /// The document is not JSON.
    #[error("OCI state on stdin is not valid JSON{}: {detail}", AfterField(.last_field.as_deref(), "in or after"))]
    Syntax {
        /// serde_json's description, with line and column.
        detail: String,
        /// The last top-level field whose name was read, if any.
        last_field: Option<String>,
    },
    /// The document is JSON but not an object.
    #[error("invalid OCI state: expected a JSON object, got {got}")]
    NotAnObject {
        /// What it is instead (`an array`, `a string`, …).
        got: &'static str,
    },
    /// A field is missing or has a value the hook cannot use.
    #[error("invalid OCI state: field \"{field}\": {problem}")]
    Field {
        /// The field's JSON name, e.g. `pid`.
        field: &'static str,
        /// What is wrong with it, naming the value found.
        problem: String,
    },
}

impl StateError {
    fn field(field: &'static str, problem: impl Into<String>) -> StateError {
        StateError::Field {
            field,
            problem: problem.into(),
        }
    }

    fn missing(field: &'static str) -> StateError {
        StateError::field(field, "is missing")
    }
}

/// Renders ` (<verb> field "<name>")` when a field name is known, nothing otherwise.
struct AfterField<'a>(Option<&'a str>, &'static str);

impl fmt::Display for AfterField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(name) => write!(f, " ({} field \"{}\")", self.1, name.escape_debug()),
            None => Ok(()),
        }
    }
}

/// Parses and validates the state as `attach` needs it: every field of [`OciState`] present and
/// well-formed. Fields are checked in document order of the runtime-spec, so the error names the
/// first bad one.
///
/// # Errors
/// A [`StateError`] naming the first problem found.
pub fn parse_for_attach(input: &[u8]) -> Result<OciState, StateError> {
    let (fields, outcome) = collect(input);
    outcome?;
    Ok(OciState {
        oci_version: string_field(&fields, "ociVersion")?,
        id: container_id(&fields)?,
        status: string_field(&fields, "status")?,
        pid: pid_field(&fields)?,
        bundle: bundle_field(&fields)?,
        annotations: annotations_field(&fields)?,
    })
}

/// Finds the container id for `detach`, which needs nothing else. Lenient on purpose: the other
/// fields are not looked at, and an `id` read before the document broke off is still used,
/// because freeing the container's place on its claim matters more than a perfect state.
///
/// # Errors
/// A [`StateError`] when no usable `id` was read.
pub fn container_id_lenient(input: &[u8]) -> Result<String, StateError> {
    let (fields, outcome) = collect(input);
    match (container_id(&fields), outcome) {
        (Ok(id), _) => Ok(id),
        // A document that broke off says more about the problem than the missing id does.
        (Err(_), Err(broken)) => Err(broken),
        (Err(bad_id), Ok(())) => Err(bad_id),
    }
}

/// Reads the top-level object field by field. Returns every field read in full, and whether the
/// whole input was a well-formed object.
fn collect(input: &[u8]) -> (Map<String, Value>, Result<(), StateError>) {
    let mut fields = Map::new();
    if input.len() > MAX_STATE_BYTES {
        return (
            fields,
            Err(StateError::TooLarge {
                limit: MAX_STATE_BYTES,
            }),
        );
    }
    if input.iter().all(u8::is_ascii_whitespace) {
        return (fields, Err(StateError::Empty));
    }
    let mut last_field = None;
    let mut de = serde_json::Deserializer::from_slice(input);
    let read = FieldCollector {
        fields: &mut fields,
        last_field: &mut last_field,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    let outcome = read.map_err(|err| classify(&err, input, last_field));
    (fields, outcome)
}

fn classify(err: &serde_json::Error, input: &[u8], last_field: Option<String>) -> StateError {
    use serde_json::error::Category;
    match err.classify() {
        Category::Eof => StateError::Truncated { last_field },
        // Only the top-level type check can fail as `Data`: every value below it is taken as
        // whatever JSON it is.
        Category::Data => StateError::NotAnObject {
            got: kind_of_document(input),
        },
        Category::Syntax | Category::Io => StateError::Syntax {
            detail: err.to_string(),
            last_field,
        },
    }
}

/// Names the kind of a JSON document that is not an object, from its first byte.
fn kind_of_document(input: &[u8]) -> &'static str {
    match input.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Reads a JSON object into `fields`, remembering the last key seen even when reading fails.
struct FieldCollector<'a> {
    fields: &'a mut Map<String, Value>,
    last_field: &'a mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for FieldCollector<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldCollector<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            *self.last_field = Some(key.clone());
            let value: Value = map.next_value()?;
            self.fields.insert(key, value);
        }
        Ok(())
    }
}

/// Renders a value for an error message: as JSON, cut short when long.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_SHOWN_VALUE_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
    cut.push('…');
    cut
}

fn string_field(fields: &Map<String, Value>, name: &'static str) -> Result<String, StateError> {
    match fields.get(name) {
        None => Err(StateError::missing(name)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(StateError::field(
            name,
            format!("must be a string, got {}", shown(other)),
        )),
    }
}

fn container_id(fields: &Map<String, Value>) -> Result<String, StateError> {
    match fields.get("id") {
        None => Err(StateError::missing("id")),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(other) => Err(StateError::field(
            "id",
            format!("must be a non-empty string, got {}", shown(other)),
        )),
    }
}

fn pid_field(fields: &Map<String, Value>) -> Result<i32, StateError> {
    let value = fields.get("pid").ok_or(StateError::missing("pid"))?;
    match value.as_i64() {
        Some(pid) if pid > 0 => i32::try_from(pid).map_err(|_| {
            StateError::field(
                "pid",
                format!("must be a PID no larger than {}, got {pid}", i32::MAX),
            )
        }),
        // Negative, zero, fractional, too large for i64, or not a number at all.
        _ => Err(StateError::field(
            "pid",
            format!("must be a positive integer, got {}", shown(value)),
        )),
    }
}

fn bundle_field(fields: &Map<String, Value>) -> Result<String, StateError> {
    match fields.get("bundle") {
        None => Err(StateError::missing("bundle")),
        Some(Value::String(s)) if s.starts_with('/') => Ok(s.clone()),
        Some(other) => Err(StateError::field(
            "bundle",
            format!("must be an absolute path, got {}", shown(other)),
        )),
    }
}

fn annotations_field(fields: &Map<String, Value>) -> Result<BTreeMap<String, String>, StateError> {
    match fields.get("annotations") {
        // Go runtimes leave out an empty map; a null is read the same way.
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(key, value)| match value {
                Value::String(s) => Ok((key.clone(), s.clone())),
                other => Err(StateError::field(
                    "annotations",
                    format!(
                        "value of \"{}\" must be a string, got {}",
                        key.escape_debug(),
                        shown(other)
                    ),
                )),
            })
            .collect(),
        Some(other) => Err(StateError::field(
            "annotations",
            format!("must be an object of strings, got {}", shown(other)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":4242,"bundle":"/run/b/c1","annotations":{"a":"b"}}"#;

    fn with(field: &str, value: &str) -> String {
        let mut state: Map<String, Value> = serde_json::from_str(GOOD).unwrap();
        state.insert(field.into(), serde_json::from_str(value).unwrap());
        Value::Object(state).to_string()
    }

    fn without(field: &str) -> String {
        let mut state: Map<String, Value> = serde_json::from_str(GOOD).unwrap();
        state.remove(field);
        Value::Object(state).to_string()
    }

    fn attach_err(input: &str) -> String {
        parse_for_attach(input.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn parses_a_complete_state() {
        let state = parse_for_attach(GOOD.as_bytes()).unwrap();
        assert_eq!(
            state,
            OciState {
                oci_version: "1.2.0".into(),
                id: "c1".into(),
                status: "creating".into(),
                pid: 4242,
                bundle: "/run/b/c1".into(),
                annotations: BTreeMap::from([("a".into(), "b".into())]),
            }
        );
    }

    #[test]
    fn ignores_unknown_fields_and_missing_annotations() {
        // crun adds `root`; runtimes may add more (runtime-spec: extra properties MAY appear).
        let mut input = without("annotations");
        input = input.replacen('{', r#"{"root":"/x/rootfs","future":[1,2],"#, 1);
        let state = parse_for_attach(input.as_bytes()).unwrap();
        assert!(state.annotations.is_empty());
        assert_eq!(state.pid, 4242);
        let null = with("annotations", "null");
        assert!(parse_for_attach(null.as_bytes())
            .unwrap()
            .annotations
            .is_empty());
    }

    #[test]
    fn names_a_negative_pid() {
        assert_eq!(
            attach_err(&with("pid", "-5")),
            r#"invalid OCI state: field "pid": must be a positive integer, got -5"#
        );
    }

    #[test]
    fn rejects_every_kind_of_bad_pid() {
        for bad in ["0", "1.5", r#""42""#, "null", "true", "1e30", "[1]"] {
            let msg = attach_err(&with("pid", bad));
            assert!(
                msg.starts_with(r#"invalid OCI state: field "pid": must be a positive integer"#),
                "{bad}: {msg}"
            );
        }
        assert_eq!(
            attach_err(&with("pid", "4294967296")),
            r#"invalid OCI state: field "pid": must be a PID no larger than 2147483647, got 4294967296"#
        );
        assert_eq!(
            attach_err(&without("pid")),
            r#"invalid OCI state: field "pid": is missing"#
        );
    }

    #[test]
    fn names_each_other_bad_field() {
        let cases = [
            (
                with("ociVersion", "1"),
                r#"field "ociVersion": must be a string, got 1"#,
            ),
            (without("ociVersion"), r#"field "ociVersion": is missing"#),
            (
                with("id", r#""""#),
                r#"field "id": must be a non-empty string, got """#,
            ),
            (
                with("id", "7"),
                r#"field "id": must be a non-empty string, got 7"#,
            ),
            (without("id"), r#"field "id": is missing"#),
            (
                with("status", "{}"),
                r#"field "status": must be a string, got {}"#,
            ),
            (without("status"), r#"field "status": is missing"#),
            (
                with("bundle", r#""relative/path""#),
                r#"field "bundle": must be an absolute path, got "relative/path""#,
            ),
            (without("bundle"), r#"field "bundle": is missing"#),
            (
                with("annotations", "[]"),
                r#"field "annotations": must be an object of strings, got []"#,
            ),
            (
                with("annotations", r#"{"k":3}"#),
                r#"field "annotations": value of "k" must be a string, got 3"#,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(attach_err(&input), format!("invalid OCI state: {want}"));
        }
    }

    #[test]
    fn reports_the_first_bad_field_in_spec_order() {
        // The shape of cases/oci/state-bad-values.json: both pid and bundle are bad.
        let input = r#"{"ociVersion":"1.0.2","id":"x","status":"creating","pid":-5,"bundle":"relative/path"}"#;
        assert!(attach_err(input).contains(r#"field "pid""#));
    }

    #[test]
    fn long_values_are_cut_short() {
        let long = format!("\"{}\"", "a".repeat(500));
        let msg = attach_err(&with("bundle", &long));
        assert!(msg.len() < 200, "{msg}");
        assert!(msg.ends_with('…'), "{msg}");
    }

    #[test]
    fn names_the_last_field_of_a_truncated_state() {
        let input =
            "{\"ociVersion\":\"1.0.2-dev\",\"id\":\"broken\",\"status\":\"creating\",\"pid\":\n";
        assert_eq!(
            attach_err(input),
            r#"OCI state on stdin is truncated (ends in field "pid")"#
        );
        assert_eq!(
            attach_err(r#"{"ociVersion":"1.0.2","annotations":{"a":"#),
            r#"OCI state on stdin is truncated (ends in field "annotations")"#
        );
        assert_eq!(attach_err("{"), "OCI state on stdin is truncated");
        assert_eq!(attach_err(r#"{"ociVer"#), "OCI state on stdin is truncated");
    }

    #[test]
    fn reports_syntax_errors_and_non_objects() {
        let msg = attach_err(r#"{"id":"c1","pid":12x}"#);
        assert!(
            msg.starts_with(r#"OCI state on stdin is not valid JSON (in or after field "pid"): "#),
            "{msg}"
        );
        let msg = attach_err(&format!("{GOOD} trailing"));
        assert!(msg.contains("not valid JSON"), "{msg}");
        assert_eq!(
            attach_err("[1,2]"),
            "invalid OCI state: expected a JSON object, got an array"
        );
        assert_eq!(
            attach_err(" 42 "),
            "invalid OCI state: expected a JSON object, got a number"
        );
        assert_eq!(
            attach_err("null"),
            "invalid OCI state: expected a JSON object, got null"
        );
    }

    #[test]
    fn rejects_empty_and_oversized_input() {
        assert_eq!(parse_for_attach(b"  \n").unwrap_err(), StateError::Empty);
        assert_eq!(parse_for_attach(b"").unwrap_err(), StateError::Empty);
        let mut big = GOOD.as_bytes().to_vec();
        big.resize(MAX_STATE_BYTES + 1, b' ');
        assert_eq!(
            parse_for_attach(&big).unwrap_err(),
            StateError::TooLarge {
                limit: MAX_STATE_BYTES
            }
        );
        // Exactly at the cap is still read.
        big.truncate(MAX_STATE_BYTES);
        assert!(parse_for_attach(&big).is_ok());
    }

    #[test]
    fn detach_needs_only_the_id() {
        let poststop =
            r#"{"ociVersion":"1.2.0","id":"c1","status":"stopped","bundle":"rel","pid":-1}"#;
        assert_eq!(container_id_lenient(poststop.as_bytes()).unwrap(), "c1");
        assert_eq!(container_id_lenient(br#"{"id":"c1"}"#).unwrap(), "c1");
    }

    #[test]
    fn detach_uses_an_id_read_before_the_state_broke_off() {
        let input = r#"{"ociVersion":"1.0.2-dev","id":"broken","status":"creating","pid":"#;
        assert_eq!(container_id_lenient(input.as_bytes()).unwrap(), "broken");
    }

    #[test]
    fn detach_without_an_id_names_the_problem() {
        assert_eq!(
            container_id_lenient(br#"{"status":"stopped"}"#)
                .unwrap_err()
                .to_string(),
            r#"invalid OCI state: field "id": is missing"#
        );
        assert_eq!(
            container_id_lenient(br#"{"status":"stopped","id""#)
                .unwrap_err()
                .to_string(),
            r#"OCI state on stdin is truncated (ends in field "id")"#
        );
        assert_eq!(container_id_lenient(b"").unwrap_err(), StateError::Empty);
    }
}
