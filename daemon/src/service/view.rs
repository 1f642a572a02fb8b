//! What readers (`get_claim`, `list_claims`, `list_gpus`, `health`) see: the registry as of
//! its last change, published whole through [`gpushare_core::Published`], so operators'
//! listings and Prometheus scrapes never wait for a prepare, attach or checkpoint write, and
//! never see a change half made.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

use gpushare_core::Published;
use gpushare_proto::ClaimInfo;

use super::State;
use crate::placement::Placement;

/// One published view of the registry.
#[derive(Debug, Clone, Default)]
pub(super) struct View {
    pub(super) claims: BTreeMap<String, ClaimInfo>,
    pub(super) placement: Placement,
    pub(super) ready: bool,
    /// The registry's generation this view shows.
    pub(super) generation: u64,
}

impl View {
    pub(super) fn of(state: &State) -> View {
        View {
            claims: state.claims.clone(),
            placement: state.placement.clone(),
            ready: state.ready,
            generation: state.generation,
        }
    }
}

/// The registry, locked; publishes a new [`View`] on drop when it was changed (borrowed
/// mutably), before the lock is released, so views are published in the order of changes.
pub(super) struct StateGuard<'a> {
    pub(super) guard: MutexGuard<'a, State>,
    pub(super) view: &'a Published<View>,
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
    /// Unlocks the registry (publishing a change, if any); returns the generation the view
    /// now shows, which includes every change made under this guard.
    pub(super) fn unlock(mut self) -> u64 {
        self.publish_if_changed();
        self.guard.generation
    }

    fn publish_if_changed(&mut self) {
        if self.changed {
            self.changed = false;
            self.guard.generation += 1;
            self.view.publish(View::of(&self.guard));
        }
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.publish_if_changed();
    }
}
