//! Small helpers to read a `serde_json::Value` field by field, with the JSON path of every
//! field at hand for error messages.
//!
//! Two reading modes are used: strict (every key of an object must be known, as NVIDIA's
//! `StrictDecoder` does for opaque parameters) and tolerant (unknown keys are ignored, as for
//! the `ResourceClaim` object the API server hands out). A `null` value is treated as absent,
//! as Go's JSON decoding does for optional pointer fields.

use gpushare_proto::ErrorCode;
use serde_json::{Map, Value};

use super::ConfigError;

/// Longest rendering of an offending value in a message, in characters.
const MAX_SHOWN_CHARS: usize = 96;

/// The value as compact JSON, cut to [`MAX_SHOWN_CHARS`] so that a message stays one short line.
pub(crate) fn show(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_SHOWN_CHARS {
        return text;
    }
    let cut: String = text.chars().take(MAX_SHOWN_CHARS).collect();
    format!("{cut}…")
}

/// A string rendered as a JSON string literal (quoted and escaped), cut like [`show`].
pub(crate) fn show_str(text: &str) -> String {
    show(&Value::String(text.to_owned()))
}

/// `path.name`, or just `name` at the root.
pub(crate) fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// `path[index]`.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// `path["key"]`, for map keys that are data rather than field names.
pub(crate) fn key(path: &str, key: &str) -> String {
    format!("{path}[{}]", show_str(key))
}

/// Short name of a JSON value's type, for "expected a string, got a number" messages.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// An object being read, with its path and the error code its faults carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Obj<'a> {
    /// The object's members.
    pub(crate) map: &'a Map<String, Value>,
    /// JSON path of the object itself.
    pub(crate) path: &'a str,
    /// Code of every error about this object's fields.
    pub(crate) code: ErrorCode,
}

impl<'a> Obj<'a> {
    /// Views `value` (found at `path`) as an object, or fails naming the path and the value.
    pub(crate) fn new(
        value: &'a Value,
        path: &'a str,
        code: ErrorCode,
    ) -> Result<Self, ConfigError> {
        match value {
            Value::Object(map) => Ok(Obj { map, path, code }),
            other => Err(ConfigError::new(
                code,
                format!(
                    "{path}: expected an object, got {} {}",
                    type_name(other),
                    show(other)
                ),
            )),
        }
    }

    /// An error about field `name` of this object.
    pub(crate) fn err(&self, name: &str, problem: impl std::fmt::Display) -> ConfigError {
        ConfigError::new(self.code, format!("{}: {problem}", join(self.path, name)))
    }

    /// Strict decoding: fails on the first member (in key order) not in `allowed`, naming it.
    pub(crate) fn deny_unknown(&self, allowed: &[&str], what: &str) -> Result<(), ConfigError> {
        match self
            .map
            .iter()
            .find(|(k, _)| !allowed.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, v)) => Err(self.err(
                k,
                format!(
                    "unknown field {} in {what} (got {}; known fields: {})",
                    show_str(k),
                    show(v),
                    allowed.join(", ")
                ),
            )),
        }
    }

    /// Field `name`, `None` when absent or `null`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        match self.map.get(name) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    /// Whether field `name` is present and not `null`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Field `name` as a string, `None` when absent.
    pub(crate) fn opt_str(&self, name: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(self.wrong_type(name, "a string", other)),
        }
    }

    /// Field `name` as a string, required.
    pub(crate) fn req_str(&self, name: &str) -> Result<&'a str, ConfigError> {
        self.opt_str(name)?
            .ok_or_else(|| self.err(name, "is required (a string)"))
    }

    /// Field `name` as a boolean, `None` when absent.
    pub(crate) fn opt_bool(&self, name: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong_type(name, "true or false", other)),
        }
    }

    /// Field `name` as a whole number, `None` when absent. Floats such as `50.5` and numbers
    /// in strings are refused, as Go's decoding into an `int` refuses them.
    pub(crate) fn opt_int(&self, name: &str) -> Result<Option<i64>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                None if n.is_u64() => Err(self.err(name, format!("value {n} is out of range"))),
                None => Err(self.wrong_type(name, "a whole number", &Value::Number(n.clone()))),
            },
            Some(other) => Err(self.wrong_type(name, "a whole number", other)),
        }
    }

    /// Field `name` as an object, `None` when absent.
    pub(crate) fn opt_obj(
        &self,
        name: &str,
        path: &'a str,
    ) -> Result<Option<Obj<'a>>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => Obj::new(v, path, self.code).map(Some),
        }
    }

    /// Field `name` as a list, `None` when absent.
    pub(crate) fn opt_list(&self, name: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.wrong_type(name, "a list", other)),
        }
    }

    /// "expected X, got <type> <value>" about field `name`.
    pub(crate) fn wrong_type(&self, name: &str, expected: &str, got: &Value) -> ConfigError {
        self.err(
            name,
            format!("expected {expected}, got {} {}", type_name(got), show(got)),
        )
    }
}
