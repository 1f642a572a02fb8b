//! The socket protocol decoder: one request line as `gpushared` reads it, the params of every
//! method, and a response line as the client reads it. Nothing may panic; a line that decodes
//! must encode again.
#![no_main]

use gpushare::server::{decode_request, nesting_exceeds, MAX_JSON_DEPTH};
use gpushare_proto::{AttachParams, DetachParams, PrepareParams, Response, UidParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nesting_exceeds(data, MAX_JSON_DEPTH);
    match decode_request(data) {
        Ok((request, _method)) => {
            serde_json::to_vec(&request).expect("a decoded request encodes");
            let p = request.params.unwrap_or(serde_json::Value::Null);
            let _ = serde_json::from_value::<PrepareParams>(p.clone());
            let _ = serde_json::from_value::<UidParams>(p.clone());
            let _ = serde_json::from_value::<AttachParams>(p.clone());
            let _ = serde_json::from_value::<DetachParams>(p);
        }
        Err(response) => {
            assert!(response.error.is_some(), "a refusal carries an error");
        }
    }
    // The client side: whatever the daemon (or an impostor) answers.
    let _ = serde_json::from_slice::<Response>(data);
});
