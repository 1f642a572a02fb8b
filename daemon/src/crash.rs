//! Named crash points for the fault-injection suite (`tests/tests/crash*.rs`).
//!
//! In a debug build, `GPUSHARE_CRASH_AT=<point>[,<point>…]` makes the daemon abort (as
//! `kill -9` would leave it: no destructor, no checkpoint write) the first time it reaches
//! one of the named points, after one line on stderr naming it. A release build compiles every
//! point to nothing, so no environment can make a production daemon crash on purpose.

/// Every crash point, in the order a prepare or an unprepare reaches them.
pub const CRASH_POINTS: &[&str] = &[
    // prepare
    "prepare.started_saved",
    "prepare.gpu_settings_applied",
    "prepare.mps_started",
    // a MIG slice's intent written, then its GPU instance made (before the record is on disk),
    // then its compute instance made (the record on disk names the GPU instance alone)
    "prepare.mig_intent_saved",
    // MIG mode turned on for the slice (a Hopper GPU, where that needs no reset), nothing
    // made yet
    "prepare.mig_mode_enabled",
    "prepare.mig_gpu_instance_created",
    "prepare.mig_compute_created",
    "prepare.cdi_written",
    "prepare.completed_saved",
    // unprepare
    "unprepare.unpreparing_saved",
    "unprepare.mps_stopped",
    // a MIG slice's destroy recorded as begun, nothing destroyed yet; then its compute
    // instance destroyed, nothing recorded since, its GPU instance not yet
    "unprepare.mig_destroy_marked",
    "unprepare.mig_compute_destroyed",
    "unprepare.cdi_removed",
    "unprepare.dirs_removed",
    // MIG mode gpushare turned on for the claim's slices off again (where they were the last
    // on the GPU), the release not yet on disk
    "unprepare.mig_mode_left",
    // the release on disk, the GPUs' settings (compute mode, time-slice) not yet restored
    "unprepare.released_saved",
    // the checkpoint writer itself, before the temporary file is renamed into place
    "checkpoint.before_write",
];

/// The environment variable that names the points to crash at.
pub const CRASH_ENV: &str = "GPUSHARE_CRASH_AT";

/// Aborts the process when `name` is among the points named in [`CRASH_ENV`] (debug builds
/// only; a no-op in release builds).
#[inline]
pub fn point(name: &'static str) {
    #[cfg(debug_assertions)]
    {
        debug_assert!(CRASH_POINTS.contains(&name), "unknown crash point {name}");
        if let Ok(list) = std::env::var(CRASH_ENV) {
            if list.split(',').any(|p| p.trim() == name) {
                eprintln!("gpushared: crash point {name} reached; aborting ({CRASH_ENV})");
                std::process::abort();
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
