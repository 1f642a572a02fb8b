//! The service's registry part: the claims and tombstones as the daemon holds them (under one
//! mutex, changed only through [`Records::state`]'s guard), their published view, the changes
//! not yet on disk and the store they go to. Its invariant: every change made under the
//! guard is published as one view and queued for the store in the same step (`view.rs`), and
//! [`Records::commit`] writes what was queued, in order, many changes in one batch (group
//! commit); a write that fails stays queued and is the checkpoint error until one succeeds.

use std::sync::Mutex;

use gpushare_core::Published;

use super::view::{Pending, StateGuard, View};
use super::State;
use crate::error::ServiceError;
use crate::store::Store;

/// The claims as recorded: in memory, published, on disk.
#[derive(Debug)]
pub(super) struct Records {
    /// The claims on disk, one record per claim.
    pub(super) store: Store,
    pub(super) state: Mutex<State>,
    /// Durable changes not yet written (see [`Records::commit`]).
    pub(super) pending: Mutex<Pending>,
    /// The registry as readers see it, republished after every change of `state`.
    pub(super) view: Published<View>,
    /// The registry's change number whose records are on disk; held while writing them.
    pub(super) on_disk: Mutex<u64>,
}

impl Records {
    /// The registry, locked: a change made through the guard is published (and queued for
    /// the store) when it is dropped or unlocked.
    pub(super) fn state(&self) -> StateGuard<'_> {
        // A panic while holding the registry leaves plain data behind, still consistent
        // enough to read and to release claims; refusing all service would be worse.
        StateGuard {
            guard: self.state.lock().unwrap_or_else(|p| p.into_inner()),
            view: &self.view,
            pending: &self.pending,
            changed: false,
        }
    }

    /// Unlocks the registry after a change and makes the change durable: writes the records
    /// of the claims and tombstones changed since the last write (queued under the registry
    /// lock as the change was published), unless a write that started after this change
    /// already did. The write happens outside the registry lock, so other claims' changes and
    /// all readers go on meanwhile, and changes that queue behind one write share the next
    /// (group commit): one batch for many changes under churn, each record its own file, so a
    /// change costs what it changed, not the node.
    ///
    /// A failed write is recorded as the checkpoint error (`health`, `gpushare status`) until
    /// a write succeeds again; its records stay queued for the next write.
    ///
    /// # Errors
    /// `Internal` when the records cannot be written; the change stays in memory (and in the
    /// view) and the caller undoes it (see [`Txn`]).
    pub(super) fn commit(&self, st: StateGuard<'_>) -> Result<(), ServiceError> {
        let change = st.unlock();
        let mut on_disk = self.on_disk.lock().unwrap_or_else(|p| p.into_inner());
        if *on_disk >= change {
            return Ok(());
        }
        let (batch, upto) = {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut p.batch), p.change)
        };
        let written = if batch.is_empty() {
            Ok(())
        } else {
            self.store.write(&batch)
        };
        let result = written.map_err(|e| {
            ServiceError::internal(format!(
                "writing checkpoint records in {}: {e}",
                self.store.dir().display()
            ))
        });
        // The registry is taken again only when the error state changes (the lock order is
        // `on_disk` then `state`; nobody takes `on_disk` while holding `state`).
        match &result {
            Ok(()) => {
                *on_disk = upto;
                if self.view.load().checkpoint_error.is_some() {
                    let mut st = self.state();
                    if st.checkpoint_error.is_some() {
                        st.checkpoint_error = None;
                        tracing::info!(path = %self.store.dir().display(), "checkpoint written again");
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the checkpoint; changing requests fail until it can be written");
                {
                    // Still to be written: newer changes queued meanwhile win.
                    let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                    let mut newer = std::mem::take(&mut p.batch);
                    newer.merge_older(batch);
                    p.batch = newer;
                }
                let mut st = self.state();
                if st.checkpoint_error.as_deref() != Some(e.message.as_str()) {
                    st.checkpoint_error = Some(e.message.clone());
                }
            }
        }
        result
    }
}
