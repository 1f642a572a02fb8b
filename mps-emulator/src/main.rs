//! `gpushare-mps-control`: see the library documentation of `gpushare_mps_emulator`.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let status = gpushare_mps_emulator::main_with_args(&args);
    std::process::exit(status);
}
