//! The OCI state document a runtime pipes into `gpushare-cdi-hook`.
#![no_main]

use gpushare_cdi_hook::state::{container_id_lenient, parse_for_attach};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = parse_for_attach(data) {
        // The lenient reader must agree on the id whenever the strict one accepts.
        assert_eq!(container_id_lenient(data).ok(), Some(state.id));
    }
    let _ = container_id_lenient(data);
});
