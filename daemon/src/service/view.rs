//! What readers (`get_claim`, `list_claims`, `list_gpus`, `health`) see: the registry as of
//! its last change, published whole through [`gpushare_core::Published`], so operators'
//! listings and Prometheus scrapes never wait for a prepare, attach or checkpoint write, and
//! never see a change half made.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, MutexGuard};

use gpushare_core::Published;
use gpushare_proto::ClaimInfo;

use super::State;
use crate::checkpoint::{Checkpoint, Tombstone};
use crate::placement::Placement;

/// One published view of the registry. Claims and placement are shared with the previous
/// view where unchanged, so publishing after a change copies only what changed (a claim
/// record compares far cheaper than it clones).
#[derive(Debug, Clone, Default)]
pub(super) struct View {
    pub(super) claims: BTreeMap<String, Arc<ClaimInfo>>,
    pub(super) placement: Arc<Placement>,
    pub(super) ready: bool,
    /// The registry's generation this view shows.
    pub(super) generation: u64,
    /// The host's boot ID, written into the checkpoint.
    pub(super) boot_id: Arc<str>,
    /// The last claim generation handed out (`State::claim_generation`).
    pub(super) claim_generation: u64,
    /// Released claims' tombstones, shared with the previous view while unchanged.
    pub(super) tombstones: Arc<BTreeMap<String, Tombstone>>,
    /// A corrupt checkpoint found at start: where it went and why.
    pub(super) quarantined: Option<String>,
    /// Claim records refused at start, one line each.
    pub(super) quarantined_records: Vec<String>,
    /// The error of the last checkpoint write, if it failed.
    pub(super) checkpoint_error: Option<String>,
    /// SIGTERM: changing requests are refused.
    pub(super) stopping: bool,
}

impl View {
    /// The view of `state`, sharing what is unchanged since `prev`.
    pub(super) fn of(state: &State, prev: Option<&View>) -> View {
        let claims = state
            .claims
            .iter()
            .map(|(uid, info)| {
                let same = prev
                    .and_then(|p| p.claims.get(uid))
                    .filter(|old| ***old == *info);
                let info = match same {
                    Some(old) => Arc::clone(old),
                    None => Arc::new(info.clone()),
                };
                (uid.clone(), info)
            })
            .collect();
        let placement = match prev {
            Some(p) if *p.placement == state.placement => Arc::clone(&p.placement),
            _ => Arc::new(state.placement.clone()),
        };
        let tombstones = match prev {
            Some(p) if *p.tombstones == state.tombstones => Arc::clone(&p.tombstones),
            _ => Arc::new(state.tombstones.clone()),
        };
        let boot_id = match prev {
            Some(p) if *p.boot_id == *state.boot_id => Arc::clone(&p.boot_id),
            _ => Arc::from(state.boot_id.as_str()),
        };
        View {
            claims,
            placement,
            ready: state.ready,
            generation: state.generation,
            boot_id,
            claim_generation: state.claim_generation,
            tombstones,
            quarantined: state.quarantined.clone(),
            quarantined_records: state.quarantined_records.clone(),
            checkpoint_error: state.checkpoint_error.clone(),
            stopping: state.stopping,
        }
    }

    /// The checkpoint of this view: claims, boot ID, claim generation and the tombstones
    /// still within their time to live (`now`, seconds since the epoch).
    pub(super) fn checkpoint(&self, now: u64) -> Checkpoint {
        let mut cp = Checkpoint {
            boot_id: self.boot_id.to_string(),
            generation: self.claim_generation,
            claims: self.claim_records(),
            tombstones: BTreeMap::clone(&self.tombstones),
            ..Checkpoint::default()
        };
        cp.prune_tombstones(now);
        cp
    }

    /// The claims as the checkpoint records them.
    pub(super) fn claim_records(&self) -> BTreeMap<String, ClaimInfo> {
        self.claims
            .iter()
            .map(|(uid, info)| (uid.clone(), ClaimInfo::clone(info)))
            .collect()
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
            // Only publishers (all under the registry lock) replace the view, so the one
            // loaded here is the latest.
            let prev = self.view.load();
            self.view.publish(View::of(&self.guard, Some(&prev)));
        }
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.publish_if_changed();
    }
}
