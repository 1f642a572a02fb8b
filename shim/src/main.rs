//! `gpushare-runtime`: an OCI runtime wrapper, called with runc's command line. For
//! `create`/`run` of a container that requests CDI devices (annotations `cdi.k8s.io/*` or
//! `GPUSHARE_VISIBLE_DEVICES`), it applies the devices' CDI edits to the bundle's
//! `config.json`; then it execs the low-level runtime (runc by default) with the same
//! arguments. See `app` for the decisions and `config` for `/etc/gpushare/runtime.toml`.
//!
//! No Rust `main`: the program is the C `main` below, so std's start-up work is skipped. The
//! wrapper runs before every runc command of every container and then becomes runc, so what
//! it does before the exec is its whole cost; std's start-up (probing fds 0–2, reading
//! `/proc/self/maps` for the main thread's stack guard, a signal stack with SIGSEGV/SIGBUS
//! handlers, SIGPIPE ignored and then reset for the exec) was about a third of the
//! wrapper's own system calls, and none of it is of use to a process that execs. Arguments
//! still come through `std::env::args_os` (std reads them at load time on glibc).
// The test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]

mod app;
mod args;
mod bundle;
mod config;
mod exec;
mod logging;
mod manual;
mod requests;

/// The C entry point: argc and argv are read through `std::env::args_os` instead. Returns
/// the exit status (1 on any failure; on success the process has become the runtime).
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    run()
}

#[cfg_attr(test, allow(dead_code))]
fn run() -> std::ffi::c_int {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // For packaging only, and exactly this form: runc has no such flag, so nothing a
    // container engine passes is taken for it.
    if let [flag, dir] = args.as_slice() {
        if flag == "--generate-man" {
            return match manual::write(std::path::Path::new(dir)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("gpushare-runtime: writing the man page into {dir:?}: {e}");
                    1
                }
            };
        }
    }
    let failure = app::run(&args, &app::Environment::from_process());
    eprintln!("gpushare-runtime: {}", failure.0);
    1
}
