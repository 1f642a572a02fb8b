//! The names a claim carries into paths and CDI device names: its UID, its request names, and
//! whether a device name is a MIG device.

use crate::config::value::show_str;
use crate::config::ConfigError;

/// Longest claim UID accepted, in bytes.
pub const MAX_CLAIM_UID_BYTES: usize = 128;

/// Checks a claim UID (`metadata.uid`) before it is used in paths and CDI device names:
/// 1–128 bytes of ASCII letters, digits, `-`, `_` and `.`, starting and ending with a letter or
/// a digit. Refusals carry `InvalidRequest` and name `metadata.uid` and the value.
pub fn validate_claim_uid(uid: &str) -> Result<(), ConfigError> {
    match claim_uid_problem(uid) {
        None => Ok(()),
        Some(why) => Err(ConfigError::invalid_request(format!(
            "metadata.uid: {} {why}",
            show_str(uid)
        ))),
    }
}

/// What is wrong with `uid` as a claim UID (the rules of [`validate_claim_uid`]), e.g.
/// `contains '/' (only …)`, for callers that name the value their own way (a request's `uid`
/// parameter, a command-line argument); `None` when it is a valid one.
pub fn claim_uid_problem(uid: &str) -> Option<String> {
    if uid.is_empty() {
        return Some("is empty".into());
    }
    if uid.len() > MAX_CLAIM_UID_BYTES {
        return Some(format!(
            "is {} bytes long (at most {MAX_CLAIM_UID_BYTES})",
            uid.len()
        ));
    }
    if let Some(c) = uid
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "contains {c:?} (only ASCII letters, digits, '-', '_' and '.' are allowed)"
        ));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(uid.chars().next()) || !edge_ok(uid.chars().last()) {
        return Some("must start and end with a letter or a digit".into());
    }
    None
}

/// Whether a device name is a MIG device: `gpu-<minor>-mig-…` as NVIDIA's DRA driver names
/// dynamic MIG slices, or a MIG UUID (`MIG-…`).
pub fn is_mig_device(name: &str) -> bool {
    if name.starts_with("MIG-") {
        return true;
    }
    let Some(rest) = name.strip_prefix("gpu-") else {
        return false;
    };
    let minor_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    minor_len > 0 && rest[minor_len..].starts_with("-mig-")
}

/// A request name as Kubernetes allows it: a DNS label, or `<request>/<subrequest>` for a
/// prioritized-list alternative. Names end up in CDI device names, so nothing else may pass.
pub(crate) fn is_request_name(name: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let mut parts = name.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), None, None) => label(a),
        (Some(a), Some(b), None) => label(a) && label(b),
        _ => false,
    }
}
