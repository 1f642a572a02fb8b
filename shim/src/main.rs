//! `gpushare-runtime`: an OCI runtime wrapper, called with runc's command line. For
//! `create`/`run` of a container that requests CDI devices (annotations `cdi.k8s.io/*` or
//! `GPUSHARE_VISIBLE_DEVICES`), it applies the devices' CDI edits to the bundle's
//! `config.json`; then it execs the low-level runtime (runc by default) with the same
//! arguments. See `app` for the decisions and `config` for `/etc/gpushare/runtime.toml`.

mod app;
mod args;
mod bundle;
mod config;
mod exec;
mod logging;
mod manual;
mod requests;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // For packaging only, and exactly this form: runc has no such flag, so nothing a
    // container engine passes is taken for it.
    if let [flag, dir] = args.as_slice() {
        if flag == "--generate-man" {
            return match manual::write(std::path::Path::new(dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gpushare-runtime: writing the man page into {dir:?}: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    let failure = app::run(&args, &app::Environment::from_process());
    eprintln!("gpushare-runtime: {}", failure.0);
    ExitCode::FAILURE
}
