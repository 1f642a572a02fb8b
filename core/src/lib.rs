//! gpushare's lock-free core: the few words that many claims and readers touch at once.
//!
//! | item | what | protects |
//! |---|---|---|
//! | [`GpuModeWord`] | one GPU's sharing mode and holder count, changed only by compare-and-swap | no two conflicting modes on one GPU; settings restored before the GPU is free again |
//! | [`Published`] | the latest status snapshot, swapped in whole | readers never wait for writers, never see half a snapshot |
//!
//! Every primitive is built on [`sync`], which is `std` normally and `loom` under
//! `--cfg gpushare_loom`, where `tests/loom.rs` checks every interleaving of small models
//! (see `CONTRIBUTING.md`). Nothing here blocks except [`Published::publish`], which waits
//! (briefly, without any lock a reader needs) for readers of the snapshot it retires.

pub mod mode;
pub mod snapshot;
pub mod sync;

pub use mode::{Admitted, GpuModeWord, LastHolder, Mode, NotHeld, Released, Want};
pub use snapshot::Published;
