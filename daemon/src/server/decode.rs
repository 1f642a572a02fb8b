//! Request lines: their JSON nesting, bounded before any parsing, and their decoding into a
//! request and its method (pure: the protocol fuzz target drives it).

use gpushare_proto::{
    ErrorBody, ErrorCode, Method, Request, Response, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use serde_json::Value;

use super::{shape, MAX_JSON_DEPTH};

/// True when `line` nests arrays and objects deeper than `max` (strings are skipped, escapes
/// included). Linear in the line, no allocation.
pub fn nesting_exceeds(line: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in line {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// An error response to a request whose version is not known (yet): it carries the oldest
/// version, which every client reads (an error has the same shape in all of them); a request's
/// own answer is then given its version. A message longer than [`MAX_MESSAGE_BYTES`] is cut
/// ([`cut_message`]).
pub(super) fn error_response(id: u64, code: ErrorCode, message: String) -> Response {
    Response {
        version: OLDEST_PROTOCOL_VERSION,
        id,
        result: None,
        error: Some(ErrorBody {
            code,
            message: cut_message(message),
        }),
    }
}

/// Longest error message sent, in bytes. Messages name the value at fault, and a request's
/// value may be up to 2 MiB long: echoed whole, it would make the answer as large as the
/// request, held by the daemon until the peer reads it.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `message`, or for one longer than [`MAX_MESSAGE_BYTES`] its start and its end (where the
/// reason is) with the middle cut out and counted.
pub fn cut_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let half = MAX_MESSAGE_BYTES / 2;
    let mut head = half;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - half;
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}… ({} bytes cut) …{}",
        &message[..head],
        tail - head,
        &message[tail..]
    )
}

/// Start of the message of a line that is not a request (the connection is then closed).
pub(super) const MALFORMED: &str = "malformed request";

/// Decodes one request line (without its newline) into the request and its method. Pure: the
/// protocol fuzz target drives it.
///
/// # Errors
/// The response to send: `InvalidRequest` for a line nested deeper than [`MAX_JSON_DEPTH`],
/// malformed JSON, JSON that is not one object (an array, too, which serde would otherwise
/// take for the envelope's fields by position), a wrong protocol version or an unknown method.
#[allow(clippy::result_large_err)]
pub fn decode_request(line: &[u8]) -> Result<(Request, Method), Response> {
    if nesting_exceeds(line, MAX_JSON_DEPTH) {
        return Err(error_response(
            0,
            ErrorCode::InvalidRequest,
            format!("{MALFORMED}: JSON nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    if let Some(why) = shape::envelope_problem(line) {
        return Err(error_response(
            0,
            ErrorCode::InvalidRequest,
            format!("{MALFORMED}: {why}"),
        ));
    }
    let request: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            let id = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_u64))
                .unwrap_or(0);
            return Err(error_response(
                id,
                ErrorCode::InvalidRequest,
                format!("{MALFORMED}: {e}"),
            ));
        }
    };
    let id = request.id;
    if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&request.version) {
        return Err(error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "protocol version {} is not supported; this daemon speaks {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
                request.version
            ),
        ));
    }
    let Some(method) = Method::parse(&request.method) else {
        let known: Vec<_> = Method::ALL.iter().map(|m| m.as_str()).collect();
        return Err(error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "unknown method {:?}; known: {}",
                request.method,
                known.join(", ")
            ),
        ));
    };
    Ok((request, method))
}
