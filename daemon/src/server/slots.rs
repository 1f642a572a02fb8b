//! Connection slots: who may hold how many of the daemon's connections at once. Pure, no I/O.
//!
//! A reader must never starve the node: a member of the socket's read group (or, with a
//! permissive socket mode, anyone) could otherwise hold every connection with half-sent
//! requests, and the kubelet plugin's `prepare` and the hook's `attach` would be refused.
//! So of [`SlotLimits::total`] slots, [`SlotLimits::reserved`] are kept for privileged peers
//! (root and `socket.changing_uids`, the ones that change state); all other peers together get
//! the rest, and each of their uids at most [`SlotLimits::per_uid`]. Privileged peers may use
//! any free slot.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The bounds, from `[socket]` in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// All connections served at once (`socket.max_connections`).
    pub total: usize,
    /// Of `total`, slots only privileged peers may take (`socket.reserved_connections`).
    pub reserved: usize,
    /// Most connections one unprivileged uid may hold (`socket.max_connections_per_uid`).
    pub per_uid: usize,
}

/// Who asks for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    /// Root or a uid in `changing_uids`.
    Privileged,
    /// Any other peer, by uid (`u32::MAX` when its credentials are unknown).
    Unprivileged(u32),
}

/// Why a connection gets no slot; the text is the `Busy` answer's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken.
    Full {
        /// `total`.
        total: usize,
    },
    /// The slots not kept for privileged peers are all taken by unprivileged ones.
    SharedFull {
        /// `total - reserved`.
        shared: usize,
        /// `reserved`.
        reserved: usize,
    },
    /// This uid holds its share.
    UidFull {
        /// The uid.
        uid: u32,
        /// `per_uid`.
        per_uid: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Full { total } => write!(
                f,
                "gpushared is serving {total} connections already (socket.max_connections); retry later"
            ),
            Refusal::SharedFull { shared, reserved } => write!(
                f,
                "the {shared} connections open to uids other than root and socket.changing_uids are all in use ({reserved} more are kept for those: socket.reserved_connections); retry later"
            ),
            Refusal::UidFull { uid, per_uid } => write!(
                f,
                "uid {uid} holds {per_uid} connections to gpushared already (socket.max_connections_per_uid); close one or retry later"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    unprivileged: usize,
    by_uid: HashMap<u32, usize>,
}

/// The slots in use. Shared by the accept loop and every connection's [`Slot`].
#[derive(Debug)]
pub struct Slots {
    limits: SlotLimits,
    counts: Mutex<Counts>,
}

impl Slots {
    /// No slot in use yet.
    pub fn new(limits: SlotLimits) -> Arc<Slots> {
        Arc::new(Slots {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent under a panic elsewhere: every change is one statement.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `holder`; it is given back when the [`Slot`] is dropped.
    ///
    /// # Errors
    /// Which bound is reached.
    pub fn admit(self: &Arc<Self>, holder: Holder) -> Result<Slot, Refusal> {
        let l = self.limits;
        let mut c = self.counts();
        if c.total >= l.total {
            return Err(Refusal::Full { total: l.total });
        }
        if let Holder::Unprivileged(uid) = holder {
            let shared = l.total.saturating_sub(l.reserved);
            if c.unprivileged >= shared {
                return Err(Refusal::SharedFull {
                    shared,
                    reserved: l.reserved,
                });
            }
            let held = c.by_uid.entry(uid).or_default();
            if *held >= l.per_uid {
                return Err(Refusal::UidFull {
                    uid,
                    per_uid: l.per_uid,
                });
            }
            *held += 1;
            c.unprivileged += 1;
        }
        c.total += 1;
        Ok(Slot {
            slots: Arc::clone(self),
            holder,
        })
    }

    /// Slots in use: all, and those of unprivileged peers.
    pub fn in_use(&self) -> (usize, usize) {
        let c = self.counts();
        (c.total, c.unprivileged)
    }
}

/// One connection's slot, given back on drop.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    holder: Holder,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.counts();
        c.total -= 1;
        if let Holder::Unprivileged(uid) = self.holder {
            c.unprivileged -= 1;
            if let Some(held) = c.by_uid.get_mut(&uid) {
                *held -= 1;
                if *held == 0 {
                    // A uid-cycling client must not grow the map.
                    c.by_uid.remove(&uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SlotLimits = SlotLimits {
        total: 8,
        reserved: 2,
        per_uid: 4,
    };

    #[test]
    fn one_uid_gets_its_share_and_no_more() {
        let slots = Slots::new(LIMITS);
        let held: Vec<Slot> = (0..4)
            .map(|_| slots.admit(Holder::Unprivileged(1000)).unwrap())
            .collect();
        assert_eq!(
            slots.admit(Holder::Unprivileged(1000)).unwrap_err(),
            Refusal::UidFull {
                uid: 1000,
                per_uid: 4
            }
        );
        // Another uid and root are not affected.
        let other = slots.admit(Holder::Unprivileged(1001)).unwrap();
        let root = slots.admit(Holder::Privileged).unwrap();
        assert_eq!(slots.in_use(), (6, 5));
        drop(held);
        assert_eq!(slots.in_use(), (2, 1));
        drop((other, root));
        assert_eq!(slots.in_use(), (0, 0));
        assert!(slots.counts().by_uid.is_empty(), "no uid left behind");
    }

    #[test]
    fn unprivileged_peers_together_leave_the_reserved_slots_alone() {
        let slots = Slots::new(LIMITS);
        let mut held: Vec<Slot> = (0..6u32)
            .map(|i| slots.admit(Holder::Unprivileged(1000 + i)).unwrap())
            .collect();
        let refused = slots.admit(Holder::Unprivileged(2000)).unwrap_err();
        assert_eq!(
            refused,
            Refusal::SharedFull {
                shared: 6,
                reserved: 2
            }
        );
        assert!(refused.to_string().contains("socket.reserved_connections"));
        // The two kept slots serve privileged peers; then everything is full.
        held.push(slots.admit(Holder::Privileged).unwrap());
        held.push(slots.admit(Holder::Privileged).unwrap());
        let full = slots.admit(Holder::Privileged).unwrap_err();
        assert_eq!(full, Refusal::Full { total: 8 });
        assert!(full.to_string().contains("serving 8 connections"));
        // A freed unprivileged slot serves an unprivileged peer again.
        held.remove(0);
        slots.admit(Holder::Unprivileged(2000)).unwrap();
    }

    #[test]
    fn privileged_peers_may_take_every_slot() {
        let slots = Slots::new(LIMITS);
        let held: Vec<Slot> = (0..8)
            .map(|_| slots.admit(Holder::Privileged).unwrap())
            .collect();
        assert_eq!(
            slots.admit(Holder::Unprivileged(1)).unwrap_err(),
            Refusal::Full { total: 8 }
        );
        assert_eq!(held.len(), 8);
    }
}
