//! The synchronization types the primitives use: `std`'s normally, `loom`'s under
//! `--cfg gpushare_loom`, so the very same code is what loom model-checks.

#[cfg(gpushare_loom)]
pub use loom::{
    cell::UnsafeCell,
    sync::atomic::{AtomicU64, Ordering},
    sync::{Mutex, MutexGuard},
    thread::yield_now,
};

#[cfg(not(gpushare_loom))]
pub use std::{
    sync::atomic::{AtomicU64, Ordering},
    sync::{Mutex, MutexGuard},
    thread::yield_now,
};

/// `std::cell::UnsafeCell` with loom's closure API (`with`, `with_mut`), so that under loom
/// every access is checked against the others for a data race.
#[cfg(not(gpushare_loom))]
#[derive(Debug)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(gpushare_loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared pointer to the contents; the caller guarantees no concurrent
    /// writer.
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a unique pointer to the contents; the caller guarantees no concurrent
    /// access at all.
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
