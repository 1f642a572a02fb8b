//! `gpushared`'s config file (TOML).
#![no_main]

use gpushare::daemon_config::DaemonConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = DaemonConfig::parse(text, std::path::Path::new("fuzz.toml"));
    }
});
