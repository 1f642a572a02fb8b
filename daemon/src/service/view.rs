//! What readers (`get_claim`, `list_claims`, `list_gpus`, `health`) see: the registry as of
//! its last change, published whole through [`gpushare_core::Published`], so operators'
//! listings and Prometheus scrapes never wait for a prepare, attach or record write, and
//! never see a change half made. A change publishes only the claims it changed (the others,
//! and every node of the map that holds none of them, are shared with the previous view, so
//! publishing costs O(changed × log claims), not O(claims)) and queues their durable records
//! for the store in the same step, so views and writes follow the order of changes.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use gpushare_core::Published;

use super::State;
use crate::claim::Claim;
use crate::placement::Placement;
use crate::store::{Batch, ClaimRecord};

/// One published view of the registry. Claims and placement are shared with the previous
/// view where unchanged.
#[derive(Debug, Clone, Default)]
pub(super) struct View {
    /// By UID; cloning it is O(1) (a persistent map, see the module's doc).
    pub(super) claims: imbl::OrdMap<String, Arc<Claim>>,
    pub(super) placement: Arc<Placement>,
    pub(super) ready: bool,
    /// A corrupt checkpoint or record found at start: where it went and why.
    pub(super) quarantined: Option<String>,
    /// Claim records refused at start, one line each.
    pub(super) quarantined_records: Vec<String>,
    /// The error of the last record write, if it failed.
    pub(super) checkpoint_error: Option<String>,
    /// SIGTERM: changing requests are refused.
    pub(super) stopping: bool,
}

/// Durable changes not yet written: the newest record of each changed claim and tombstone,
/// and the registry's change number they include.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) batch: Batch,
    pub(super) change: u64,
}

impl View {
    /// The view of `state` after a change to the claims in `shown`, sharing the rest with
    /// `prev`.
    fn next(state: &State, prev: &View, shown: &std::collections::BTreeSet<String>) -> View {
        if shown.is_empty() {
            return View {
                claims: prev.claims.clone(),
                ..View::rest(state)
            };
        }
        let mut claims = prev.claims.clone();
        for uid in shown {
            match state.claims.get(uid) {
                Some(info) => {
                    claims.insert(uid.clone(), Arc::new(info.clone()));
                }
                None => {
                    claims.remove(uid);
                }
            }
        }
        View {
            claims,
            ..View::rest(state)
        }
    }

    /// Everything but the claims. The placement is copied as it is: that costs O(GPUs)
    /// (its holders are persistent sets), less than comparing it with the last one would.
    fn rest(state: &State) -> View {
        View {
            claims: imbl::OrdMap::new(),
            placement: Arc::new(state.placement.clone()),
            ready: state.ready,
            quarantined: state.quarantined.clone(),
            quarantined_records: state.quarantined_records.clone(),
            checkpoint_error: state.checkpoint_error.clone(),
            stopping: state.stopping,
        }
    }
}

/// The registry, locked; publishes a new [`View`] on drop when it was changed (borrowed
/// mutably), before the lock is released, and queues the changed claims' records.
pub(crate) struct StateGuard<'a> {
    pub(super) guard: MutexGuard<'a, State>,
    pub(super) view: &'a Published<View>,
    pub(super) pending: &'a Mutex<Pending>,
    pub(super) changed: bool,
}

impl Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.changed = true;
        &mut self.guard
    }
}

impl StateGuard<'_> {
    /// Unlocks the registry (publishing a change, if any); returns the change number the view
    /// now shows, which includes every change made under this guard.
    pub(super) fn unlock(mut self) -> u64 {
        self.publish_if_changed();
        self.guard.change
    }

    fn publish_if_changed(&mut self) {
        if !self.changed {
            return;
        }
        self.changed = false;
        let st = &mut *self.guard;
        st.change += 1;
        let shown = st.claims.take_shown();
        let durable = st.claims.take_durable();
        let tombstones = st.tombstones.take_changed();
        // Under the pending lock, so that a writer takes every record queued up to the
        // change number it reads.
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for uid in durable {
            let rec = st.claims.get(&uid).map(ClaimRecord::of);
            pending.batch.claims.insert(uid, rec);
        }
        for uid in tombstones {
            let t = st.tombstones.get(&uid).cloned();
            pending.batch.tombstones.insert(uid, t);
        }
        pending.change = st.change;
        // Only publishers (all under the registry lock) replace the view, so the one loaded
        // here is the latest.
        let prev = self.view.load();
        self.view.publish(View::next(st, &prev, &shown));
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.publish_if_changed();
    }
}
