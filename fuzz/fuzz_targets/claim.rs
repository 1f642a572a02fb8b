//! The claim parser: a ResourceClaim document (JSON or YAML, as `gpushare prepare -f` and the
//! DRA driver send it) through to the claim spec the daemon acts on.
#![no_main]

use gpushare::config::{parse_claim, parse_claim_document, ParseContext};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(claim) = parse_claim_document(text) else {
        return;
    };
    let ctx = ParseContext {
        node_name: "ip-10-0-1-23.us-west-2.compute.internal".to_string(),
        drivers: vec!["gpu.nvidia.com".to_string()],
    };
    if let Ok(spec) = parse_claim(&claim, &ctx) {
        // What reaches a path must be safe for one.
        gpushare::config::validate_claim_uid(&spec.uid).expect("a parsed claim's UID is valid");
    }
});
