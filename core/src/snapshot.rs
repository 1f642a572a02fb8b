//! The latest status snapshot, published whole: readers never wait for the publisher and
//! never see half of one.
//!
//! Two slots hold snapshots; one state word holds which slot is current (bit 63) and how many
//! readers are inside each slot (bits 0..31 and 32..63, less the top bit). A reader registers
//! in the current slot and reads that slot's parity in one compare-and-swap, so it can never
//! register in one slot and read the other; it clones the snapshot's `Arc` and leaves. The
//! publisher (one at a time) writes the spare slot, which no reader is inside, flips the
//! current bit, waits until the readers still inside the old slot leave (each only clones an
//! `Arc`), and empties the old slot. Readers never block: a reader retries only when another
//! reader or a publish changed the word in between.

use std::sync::Arc;

use crate::sync::{yield_now, AtomicU64, Mutex, Ordering, UnsafeCell};

const CURRENT: u64 = 1 << 63;
const READERS_MASK: u64 = (1 << 31) - 1;

fn reader_shift(slot: usize) -> u32 {
    if slot == 0 {
        0
    } else {
        32
    }
}

fn readers_in(word: u64, slot: usize) -> u64 {
    (word >> reader_shift(slot)) & READERS_MASK
}

fn current_slot(word: u64) -> usize {
    usize::from(word & CURRENT != 0)
}

/// A value many threads read while one at a time replaces it.
pub struct Published<T> {
    slots: [UnsafeCell<Option<Arc<T>>>; 2],
    state: AtomicU64,
    publisher: Mutex<()>,
}

impl<T> std::fmt::Debug for Published<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

// SAFETY: the slots are only reached through `load` and `publish`, whose protocol (module
// docs) never lets a write of a slot overlap any other access to it; the values are shared
// across threads as `Arc<T>`, which needs `T: Send + Sync`.
unsafe impl<T: Send + Sync> Sync for Published<T> {}
// SAFETY: as above; moving the whole structure moves `Arc<T>`s.
unsafe impl<T: Send + Sync> Send for Published<T> {}

impl<T> Published<T> {
    /// Publishes `initial` as the first snapshot.
    pub fn new(initial: T) -> Published<T> {
        Published {
            slots: [
                UnsafeCell::new(Some(Arc::new(initial))),
                UnsafeCell::new(None),
            ],
            state: AtomicU64::new(0),
            publisher: Mutex::new(()),
        }
    }

    /// The current snapshot. Never blocks; it retries only when the state word changed
    /// between its read and its compare-and-swap.
    pub fn load(&self) -> Arc<T> {
        let mut cur = self.state.load(Ordering::Relaxed);
        let slot = loop {
            let slot = current_slot(cur);
            // Acquire: the publisher's write of this slot (released by its flip of CURRENT,
            // which every later compare-and-swap of the word carries on) is visible to us.
            match self.state.compare_exchange_weak(
                cur,
                cur + (1 << reader_shift(slot)),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break slot,
                Err(now) => cur = now,
            }
        };
        // SAFETY: we are registered in `slot`, which was current when we registered; the
        // publisher writes only the spare slot and empties this one only after every reader
        // registered in it has left (below), so nobody writes it while we read.
        let snapshot = self.slots[slot].with(|p| unsafe { (*p).clone() });
        // Release: our read of the slot happens-before the publisher's emptying of it, which
        // waits for this count to reach zero with Acquire.
        self.state
            .fetch_sub(1 << reader_shift(slot), Ordering::Release);
        snapshot.unwrap_or_else(|| unreachable!("the current slot always holds a snapshot"))
    }

    /// Replaces the snapshot. Waits for an earlier publish to finish and for readers still
    /// inside the slot it retires (they only clone an `Arc`); never for new readers.
    pub fn publish(&self, next: T) {
        let _one_publisher = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
        let live = current_slot(self.state.load(Ordering::Relaxed));
        let spare = 1 - live;
        let next = Some(Arc::new(next));
        // SAFETY: no reader is inside the spare slot: the previous publish waited until its
        // readers left, and a reader registers only in the current slot, atomically with
        // seeing which slot that is. The publisher lock keeps other publishers out.
        self.slots[spare].with_mut(|p| unsafe { *p = next });
        // Release: readers that register in `spare` after this (Acquire) see its new value.
        self.state.fetch_xor(CURRENT, Ordering::Release);
        // Acquire: every reader's read of `live` (released by its leaving) happens-before the
        // emptying below.
        while readers_in(self.state.load(Ordering::Acquire), live) != 0 {
            yield_now();
        }
        // SAFETY: `live` is no longer current, so no reader can register in it, and the ones
        // that did have left.
        let retired = self.slots[live].with_mut(|p| unsafe { (*p).take() });
        drop(retired);
    }
}

#[cfg(all(test, not(gpushare_loom)))]
mod tests {
    use super::*;

    #[test]
    fn readers_see_each_published_value_whole() {
        let p = Arc::new(Published::new((0u64, 0u64)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let p = Arc::clone(&p);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut reads = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let s = p.load();
                        assert_eq!(s.0, s.1, "half a snapshot");
                        assert!(s.0 >= last, "went back from {last} to {}", s.0);
                        last = s.0;
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for i in 1..=2000u64 {
            p.publish((i, i));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.join().expect("reader");
        }
        assert_eq!(*p.load(), (2000, 2000));
        // Old snapshots are freed: only the current one is still referenced.
        assert_eq!(Arc::strong_count(&p.load()), 2);
    }
}
