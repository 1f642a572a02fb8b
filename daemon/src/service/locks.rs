//! Per-claim locks for the service's changing calls.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One lock per claim UID, so that a kubelet retry never interleaves with the same claim's
/// prepare or unprepare, while different claims proceed in parallel (a slow or stuck MPS
/// daemon of one claim holds up nobody else). Entries live only while someone holds or waits.
#[derive(Debug, Default)]
pub(super) struct ClaimLocks {
    pub(super) locks: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A held claim lock; forgets the map entry on drop when nobody else holds or waits for it.
pub(super) struct ClaimGuard<'a> {
    owner: &'a ClaimLocks,
    uid: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl ClaimLocks {
    /// Blocks until this thread holds `uid`'s lock. Must not be called from async code (the
    /// service runs on tokio's blocking pool).
    pub(super) fn lock(&self, uid: &str) -> ClaimGuard<'_> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(uid.to_string()).or_default())
        };
        ClaimGuard {
            owner: self,
            uid: uid.to_string(),
            guard: Some(lock.blocking_lock_owned()),
        }
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.owner.locks.lock().unwrap_or_else(|p| p.into_inner());
        drop(self.guard.take());
        // Two references left (the map's and none other after our guard's is gone) means
        // nobody waits: the entry can go.
        if map
            .get(&self.uid)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.uid);
        }
    }
}
