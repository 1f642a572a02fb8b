//! Sharing strategies, one file (or folder) each: [`exclusive`], [`time_slicing`], [`mps`]
//! (per-claim MPS control daemons; [`mps_support`], which GPUs can keep an MPS claim's
//! settings) and [`mig`] (MIG devices made and destroyed per claim, and everything else MIG:
//! its intents, MIG mode, `mig apply`'s layouts, the start-up sweep and recovery).
//!
//! What a strategy does for a claim's device group is [`group`]'s two traits: what a prepare
//! makes for it ([`GroupStrategy`]: planned, applied, recorded), and everything after, read
//! from the group's record alone ([`GroupLife`]: the GPUs it holds, what its containers get,
//! what a release stops and destroys), each through the few effects the service lends
//! ([`GroupEffects`]). [`select`] is the one place a strategy is chosen: from a claim's config
//! ([`select::plan`], which hands the group to the strategy's own `plan`), from a recorded
//! group ([`life_of`]), from a GPU's hold ([`of_want`]); [`asked`] is what a prepare of each
//! asked, to refuse a retry that changes it.
//!
//! # Adding a sharing strategy
//!
//! The files a new strategy touches, and nothing else (the compiler finds every `match` on
//! [`crate::claim::Sharing`] and the protocol's `StrategyInfo` that needs its arm):
//!
//! 1. `config/mod.rs` (its `config::Sharing` variant) and its parser (`config/nvidia.rs` for
//!    NVIDIA's `GpuConfig`, `config/short.rs` for the short form);
//! 2. `gpushare-proto`'s `StrategyInfo` (`types.rs`, with its summary), its schema and
//!    reference (`docs/protocol.schema.json`, `docs/protocol.md`, checked against each other
//!    by `cdi-hook/tests/schema.rs`), and the CLI's `claim_detail` (`cli/src/lib.rs`): how
//!    the socket and the CLI report it;
//! 3. only when it shares a GPU in a way no existing mode does: `gpushare-core`'s `Want`
//!    (the lock-free mode word), with `placement.rs`'s `Hold`, admission's words for it
//!    (`admission.rs`), and the protocol's `GpuSharing` with its metric label
//!    (`metrics/collector.rs`);
//! 4. `claim/model.rs`: its `Sharing` variant, what a group of it holds on the host;
//! 5. `claim/wire.rs` and `store/record.rs`: that variant on the wire and on disk;
//! 6. `strategy/<name>.rs`: its `plan` (its GPUs checked, its config resolved, touching
//!    nothing), [`Strategy`] (its GPU setting), [`GroupStrategy`] and [`GroupLife`];
//! 7. `strategy/select.rs` (its arm in each constructor: from a config, a record, a hold) and
//!    `strategy/asked.rs` (what a prepare of it asked).
//!
//! The service plans, applies, revives and releases a claim's groups through these traits,
//! and never matches on a strategy. It does call into MPS and MIG for what is node-wide
//! rather than one group's (MPS supervision and stray daemons; MIG device names, `mig
//! apply`, `list_gpus`, MIG mode after a release, the start-up sweep), which a strategy
//! without such work does not touch.
//!
//! `CONTRIBUTING.md` keeps this list; the next strategy (fractional GPUs) is held to it.
//!
//! What every strategy does to a whole GPU it holds is the [`Strategy`] trait: the setting it
//! needs there (a time-slice interval, compute mode `EXCLUSIVE_PROCESS`), set when a group is
//! prepared, checked again at start, and put back to the node's default by the GPU's last
//! holder. The service and admission reach a GPU's setting through it only, never through a
//! match on the strategy; which claims may share a GPU is admission's (`crate::admission`).

use crate::error::ServiceError;
use crate::gpu::GpuBackend;

pub mod asked;
pub mod exclusive;
pub mod group;
pub mod mig;
pub mod mps;
pub mod mps_support;
pub mod select;
pub mod time_slicing;

pub use exclusive::Exclusive;
pub use group::{Applied, GpuHold, GroupEffects, GroupLife, GroupStrategy, Revival};
pub use mig::Mig;
pub use mps::Mps;
pub use select::{life_of, of_want};
pub use time_slicing::TimeSlicing;

/// A strategy's hold on one whole GPU. `uuid` names the GPU to the backend, `device` (its DRA
/// device name, `gpu-<minor>`) names it in errors and logs. A strategy that needs no setting
/// keeps the defaults, which do nothing.
pub trait Strategy: Send + Sync {
    /// Whether [`Strategy::set_up`] changes the GPU; `false` (the default) for a strategy
    /// that keeps the defaults. A prepare marks a change with a crash point
    /// (`prepare.gpu_settings_applied`), so that the crash suite kills gpushared between a
    /// changed GPU and what records it.
    fn has_setting(&self) -> bool {
        false
    }

    /// Sets the GPU up for a group of this strategy, before anything else of the group is
    /// made (the backend's NVML or `nvidia-smi` call).
    ///
    /// # Errors
    /// The backend's refusal: `Unsupported` where the GPU cannot take the setting,
    /// `Conflict` where another client holds it busy, `Internal` otherwise; the message names
    /// the setting and the device.
    fn set_up(
        &self,
        _backend: &dyn GpuBackend,
        _uuid: &str,
        _device: &str,
    ) -> Result<(), ServiceError> {
        Ok(())
    }

    /// At start, for a GPU its claims still hold: sets it up again (logged) where the GPU lost
    /// the setting while gpushared was down (a driver reload, someone's `nvidia-smi`).
    fn check_again(&self, _backend: &dyn GpuBackend, _uuid: &str, _device: &str) {}

    /// The GPU's last holder is gone: puts the setting back to the node's default (logged on
    /// failure; the GPU is free either way).
    fn restore(&self, _backend: &dyn GpuBackend, _uuid: &str, _device: &str) {}

    /// At start, on a GPU no claim of this strategy holds: puts this strategy's setting back
    /// to the node's default where it reads back otherwise (logged), as the last holder's
    /// release would have: a gpushared killed between changing a GPU and recording its
    /// claim, or between a release and the restore, leaves one behind
    /// ([`select::clear_leftovers`] calls it).
    fn clear_leftover(&self, _backend: &dyn GpuBackend, _uuid: &str, _device: &str) {}
}

#[cfg(test)]
mod tests;
