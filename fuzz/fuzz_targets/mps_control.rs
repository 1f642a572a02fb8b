//! MPS control commands and replies: the command parser of our `nvidia-cuda-mps-control`
//! stand-in (what the daemon's set/get commands and operators' scripts go through).
#![no_main]

use gpushare_mps_emulator::command::{
    parse_limit_bytes, parse_percentage, Caller, ControlState, StartEnv,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_percentage(text);
    let _ = parse_limit_bytes(text);
    let (mut state, _) = ControlState::new(&StartEnv::default());
    for line in text.lines().take(64) {
        let _ = state.execute(line, Caller { uid: 0 });
        let _ = state.execute(line, Caller { uid: 1000 });
    }
});
