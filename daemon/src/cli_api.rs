//! What the operators' CLI (`gpushare-cli`: `gpushare`, its demo and doctor) takes from this
//! library, and nothing more: the CLI reads what `gpushared` reads (its config file, its
//! checkpoint, the node catalog) and checks what `gpushared` would do (the MPS control program
//! it would run, NVIDIA's toolkit it would find), so it asks the daemon's own code rather than
//! a copy of it. It talks to a running daemon through `gpushare-proto` only; the claim
//! service, the socket server, the strategies and the registry are not here on purpose.
//!
//! Every item is a re-export: the module it comes from stays its home (and its docs). The CLI
//! crate uses `gpushare::cli_api` and no other path of this library (its `layout` test checks
//! that), so this file is the whole list of what the CLI depends on.

/// Claim input: a ResourceClaim file (JSON or YAML) is parsed before `gpushare prepare`
/// sends it, and a UID on the command line is checked by the daemon's own rules.
pub use crate::config::{claim_uid_problem, parse_claim_document};

/// `gpushared`'s config file, which `gpushare doctor` checks and reads its paths from.
pub use crate::daemon_config::{DaemonConfig, DriverSpecMode, DEFAULT_CONFIG_PATH};

/// The checkpoint, read (never written) by `gpushare doctor`'s checkpoint check.
pub use crate::checkpoint::Checkpoint;

/// The per-claim record store (`<state-dir>/store.json`, `<state-dir>/records/`), read (never
/// written) by `gpushare doctor`'s checkpoint check as one [`Checkpoint`].
pub mod store {
    pub use crate::store::{snapshot, CLAIMS_DIR, STORE_FILE};
}

/// The simulated node catalog (`gpushare profiles`, `doctor --simulate`) and the GPU records
/// its profiles yield.
pub use crate::gpu::{catalog, Gpu, NodeProfile};

/// The driver spec's file name from its CDI kind (doctor, demo) and where NVIDIA's
/// `nvidia-ctk` is found (doctor).
pub use crate::driver_spec::{nvidia_ctk, split_kind};

/// Which MPS control program an empty `[mps] control` means (doctor).
pub use crate::mps_program::{default_program, is_emulator};

/// Process checks: who holds `gpushared.lock` (doctor), whether an MPS control daemon is
/// gone (the demo's "nothing left behind").
pub use crate::sys::{find_lock_holder, pid_alive};

/// A CDI device's edits applied to an OCI `config.json` (the demo's runc container).
pub use crate::cdi::apply_to_oci_config;

/// Removing a file that may be absent (the demo's runc bundle).
pub use crate::fsutil::remove_file_if_exists;
