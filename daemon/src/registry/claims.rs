//! The registry's claims and tombstones, which remember what changed since they were last
//! published and written: a change is shown to readers and made durable for that claim
//! alone, never by copying or writing the whole node.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;

use crate::checkpoint::Tombstone;
use crate::claim::lifecycle::take;
use crate::claim::{Attachment, Cause, Claim, Event, IllegalTransition, Next, Phase};

/// Why [`Claims::transition`] changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// No such claim.
    #[error("no claim {0}")]
    NotFound(String),
    /// The lifecycle does not allow it.
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// Claims by UID, with the UIDs changed since [`Claims::take_shown`] (for the published view)
/// and since [`Claims::take_durable`] (for the store). Read through `Deref`; every change goes
/// through a method here, which says which of the two it concerns.
#[derive(Debug, Default)]
pub struct Claims {
    map: BTreeMap<String, Claim>,
    shown: BTreeSet<String>,
    durable: BTreeSet<String>,
    /// UIDs of the claims that ran an MPS control daemon when [`Claims::take_shown`] last
    /// ran: with `shown` (every claim changed since), a superset of those that run one now.
    /// The supervisor asks for the daemons at every MPS prepare and release, and a pass over
    /// every claim held made each such change cost what the node holds (10,000 time-sliced
    /// claims beside one MPS claim); see [`Claims::running_mps`].
    mps: BTreeSet<String>,
}

impl Deref for Claims {
    type Target = BTreeMap<String, Claim>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Claims {
    fn touch(&mut self, uid: &str) {
        self.shown.insert(uid.to_string());
        self.durable.insert(uid.to_string());
    }

    /// A claim to change durably (its devices, MPS and MIG records, last error). Its phase is
    /// changed only by [`Claims::transition`].
    pub fn get_mut(&mut self, uid: &str) -> Option<&mut Claim> {
        if self.map.contains_key(uid) {
            self.touch(uid);
        }
        self.map.get_mut(uid)
    }

    /// A claim's attached containers, to change: shown to readers and kept in the claim's
    /// run-directory record, never written to the store (they die with the boot).
    pub fn attachments_mut(&mut self, uid: &str) -> Option<&mut Vec<Attachment>> {
        if self.map.contains_key(uid) {
            self.shown.insert(uid.to_string());
        }
        self.map.get_mut(uid).map(|c| &mut c.attached)
    }

    /// Adds (or replaces) a claim.
    pub fn insert(&mut self, uid: String, info: Claim) -> Option<Claim> {
        self.touch(&uid);
        self.map.insert(uid, info)
    }

    /// Adds a claim read back from the store as it is there: shown, not written again.
    pub fn adopt(&mut self, uid: String, info: Claim) {
        self.shown.insert(uid.clone());
        self.map.insert(uid, info);
    }

    /// Marks a claim's record to be written (it was rebuilt from elsewhere than the store, or
    /// corrected on load).
    pub fn mark_durable(&mut self, uid: &str) {
        if self.map.contains_key(uid) {
            self.touch(uid);
        }
    }

    /// Removes a claim without a lifecycle event: a rollback of its insertion, or a record
    /// refused at start.
    pub fn remove(&mut self, uid: &str) -> Option<Claim> {
        let gone = self.map.remove(uid);
        if gone.is_some() {
            self.touch(uid);
        }
        gone
    }

    /// Puts back what a transaction saved of `uid`: the record as it was, or its absence.
    pub fn restore(&mut self, uid: &str, saved: Option<Claim>) {
        self.touch(uid);
        match saved {
            Some(info) => {
                self.map.insert(uid.to_string(), info);
            }
            None => {
                self.map.remove(uid);
            }
        }
    }

    /// The one writer of a claim's phase and causes: applies `event` through the lifecycle
    /// ([`crate::claim::lifecycle`]). `Released` removes the claim.
    ///
    /// # Errors
    /// No such claim, or the lifecycle refuses; nothing changes.
    pub fn transition(&mut self, uid: &str, event: Event) -> Result<Next, TransitionError> {
        self.degrade(uid, event, Vec::new())
    }

    /// As [`Claims::transition`], with what happened for each cause `event` adds (the
    /// claim's message is rendered from them).
    ///
    /// # Errors
    /// No such claim, or the lifecycle refuses; nothing changes.
    pub fn degrade(
        &mut self,
        uid: &str,
        event: Event,
        details: Vec<(Cause, String)>,
    ) -> Result<Next, TransitionError> {
        let info = self
            .map
            .get_mut(uid)
            .ok_or_else(|| TransitionError::NotFound(uid.to_string()))?;
        let next = take(info, event, details)?;
        match next {
            Next::Phase(..) => self.touch(uid),
            Next::Gone => {
                self.remove(uid);
            }
        }
        Ok(next)
    }

    /// The phase of `uid`, if it is held.
    pub fn phase(&self, uid: &str) -> Option<Phase> {
        self.map.get(uid).map(|c| c.phase)
    }

    /// UIDs changed since the last call, for the view.
    pub fn take_shown(&mut self) -> BTreeSet<String> {
        let shown = std::mem::take(&mut self.shown);
        for uid in &shown {
            if self.map.get(uid).is_some_and(Claim::runs_mps) {
                self.mps.insert(uid.clone());
            } else {
                self.mps.remove(uid);
            }
        }
        shown
    }

    /// The claims with an MPS device group (each runs MPS control daemons), in UID order, in
    /// time that grows with them and with the claims changed since the view was last
    /// published, never with every claim held.
    pub fn running_mps(&self) -> impl Iterator<Item = &Claim> {
        // Both sets are sorted: their union yields each UID once.
        self.mps
            .union(&self.shown)
            .filter_map(|uid| self.map.get(uid))
            .filter(|c| c.runs_mps())
    }

    /// UIDs whose durable record changed since the last call, for the store.
    pub fn take_durable(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.durable)
    }
}

/// Tombstones by claim UID, with the UIDs changed since [`Tombstones::take_changed`].
#[derive(Debug, Default)]
pub struct Tombstones {
    map: BTreeMap<String, Tombstone>,
    changed: BTreeSet<String>,
}

impl Deref for Tombstones {
    type Target = BTreeMap<String, Tombstone>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Tombstones {
    /// All of `map`, as loaded (nothing to write).
    pub fn loaded(map: BTreeMap<String, Tombstone>) -> Tombstones {
        Tombstones {
            map,
            changed: BTreeSet::new(),
        }
    }

    /// Adds a tombstone, then drops those past their time to live at `now` and the oldest
    /// beyond the cap (`crate::checkpoint::prune_tombstones`).
    pub fn insert(&mut self, uid: String, t: Tombstone, now: u64) {
        self.changed.insert(uid.clone());
        self.map.insert(uid, t);
        let before: BTreeSet<String> = if self.map.len() > crate::checkpoint::MAX_TOMBSTONES
            || self
                .map
                .values()
                .any(|t| now.saturating_sub(t.released_at) >= crate::checkpoint::TOMBSTONE_TTL_SECS)
        {
            self.map.keys().cloned().collect()
        } else {
            return;
        };
        crate::checkpoint::prune_tombstones(&mut self.map, now);
        for uid in before {
            if !self.map.contains_key(&uid) {
                self.changed.insert(uid);
            }
        }
    }

    /// Removes a tombstone (a prepare of the claim lifted it).
    pub fn remove(&mut self, uid: &str) -> Option<Tombstone> {
        let t = self.map.remove(uid);
        if t.is_some() {
            self.changed.insert(uid.to_string());
        }
        t
    }

    /// Puts back what a transaction saved of `uid`'s tombstone.
    pub fn restore(&mut self, uid: &str, saved: Option<Tombstone>) {
        self.changed.insert(uid.to_string());
        match saved {
            Some(t) => {
                self.map.insert(uid.to_string(), t);
            }
            None => {
                self.map.remove(uid);
            }
        }
    }

    /// UIDs changed since the last call.
    pub fn take_changed(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{Group, Sharing};

    fn claim(uid: &str, phase: Phase) -> Claim {
        Claim {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "n".into(),
            phase,
            groups: vec![],
            requests: vec![],
            cdi_spec: String::new(),
            attach_limit: None,
            attached: vec![],
            degraded: Default::default(),
            last_error: None,
            restarts: 0,
            resource_version: None,
            generation: 1,
        }
    }

    #[test]
    fn attachments_are_shown_but_not_written_and_phases_go_through_the_lifecycle() {
        let mut c = Claims::default();
        c.insert("a".into(), claim("a", Phase::PrepareStarted));
        assert_eq!(c.take_durable(), BTreeSet::from(["a".to_string()]));
        c.take_shown();
        c.attachments_mut("a").unwrap().clear();
        assert!(c.take_durable().is_empty(), "attachments are not durable");
        assert_eq!(c.take_shown().len(), 1);
        assert_eq!(
            c.transition("a", Event::DaemonDied),
            Err(TransitionError::Illegal(IllegalTransition {
                from: Phase::PrepareStarted,
                event: Event::DaemonDied
            }))
        );
        assert!(
            c.take_durable().is_empty(),
            "a refused event changes nothing"
        );
        assert_eq!(
            c.transition("a", Event::Applied),
            Ok(Next::Phase(Phase::Prepared, crate::claim::Causes::NONE))
        );
        assert_eq!(c["a"].phase, Phase::Prepared);
        assert_eq!(c.take_durable().len(), 1);
        c.transition("a", Event::ReleaseStarted).unwrap();
        assert_eq!(c.transition("a", Event::Released), Ok(Next::Gone));
        assert!(!c.contains_key("a"));
        assert_eq!(
            c.transition("a", Event::Released),
            Err(TransitionError::NotFound("a".into()))
        );
    }

    /// A claim with one device group shared through MPS.
    fn mps_claim(uid: &str) -> Claim {
        let mut c = claim(uid, Phase::Prepared);
        c.groups.push(Group {
            requests: vec!["gpu".into()],
            devices: vec![],
            sharing: Sharing::Mps(crate::claim::MpsDaemon {
                control_daemon_pid: 7,
                pipe_dir: format!("/run/gpushare/claims/{uid}/mps-00000/pipe"),
                log_dir: String::new(),
                shm_dir: String::new(),
                visible_devices: vec![],
                active_thread_percentage: "100.0".into(),
                pinned_device_memory_limits: Default::default(),
                control_daemon_start_time: 0,
                requested: Default::default(),
                restarts: 0,
            }),
        });
        c
    }

    fn mps_uids(c: &Claims) -> Vec<String> {
        c.running_mps().map(|c| c.uid.clone()).collect()
    }

    /// The index behind `running_mps` (the supervisor's set of daemons, asked at every MPS
    /// prepare and release) follows every kind of change, before and after the view takes
    /// the changed UIDs, and holds nothing of the other claims.
    #[test]
    fn the_claims_running_mps_follow_every_change() {
        let mut c = Claims::default();
        for i in 0..50 {
            c.insert(
                format!("ts-{i:02}"),
                claim(&format!("ts-{i:02}"), Phase::Prepared),
            );
        }
        c.insert("m1".into(), mps_claim("m1"));
        assert_eq!(mps_uids(&c), ["m1"], "before the view took the changes");
        c.take_shown();
        assert_eq!(mps_uids(&c), ["m1"], "after");
        assert_eq!(c.mps.len(), 1, "the index holds the MPS claims alone");

        // A claim becomes MPS through get_mut (a prepare records its daemon), one stops.
        *c.get_mut("ts-07").unwrap() = mps_claim("ts-07");
        c.get_mut("m1").unwrap().groups.clear();
        assert_eq!(mps_uids(&c), ["ts-07"]);
        c.take_shown();
        assert_eq!(mps_uids(&c), ["ts-07"]);

        // Released through the lifecycle, rolled back, restored, adopted at start.
        c.transition("ts-07", Event::ReleaseStarted).unwrap();
        assert_eq!(mps_uids(&c), ["ts-07"], "Unpreparing still runs it");
        c.transition("ts-07", Event::Released).unwrap();
        assert!(mps_uids(&c).is_empty());
        c.take_shown();
        assert!(mps_uids(&c).is_empty());
        c.restore("m2", Some(mps_claim("m2")));
        c.adopt("m3".into(), mps_claim("m3"));
        assert_eq!(mps_uids(&c), ["m2", "m3"]);
        c.take_shown();
        c.remove("m2");
        c.restore("m3", None);
        assert!(mps_uids(&c).is_empty());
        c.take_shown();
        assert!(mps_uids(&c).is_empty());
        assert!(c.mps.is_empty(), "nothing left in the index");
    }

    #[test]
    fn pruned_tombstones_count_as_changed() {
        let mut t = Tombstones::default();
        let ts = |g, at| Tombstone {
            generation: g,
            resource_version: None,
            released_at: at,
        };
        t.insert("old".into(), ts(1, 1), 1);
        t.take_changed();
        t.insert("new".into(), ts(2, 1_000_000), 1_000_000);
        assert_eq!(
            t.take_changed(),
            BTreeSet::from(["new".to_string(), "old".to_string()])
        );
        assert!(!t.contains_key("old"));
    }
}
