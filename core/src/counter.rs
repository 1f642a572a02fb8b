//! A counter that can never pass its limit nor go below zero: a claim's attached containers
//! against its `replicas`.

use crate::sync::{AtomicU32, Ordering};

/// `try_acquire` found the counter at its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("all {limit} slots are taken")]
pub struct AtLimit {
    /// The limit that was reached.
    pub limit: u32,
}

/// `release` found the counter at zero: a release without an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("released more slots than were acquired")]
pub struct Underflow;

/// A count of taken slots in `0..=limit`, changed only by compare-and-swap.
///
/// `try_acquire` succeeding happens-after the `release` that freed the slot it takes
/// (Acquire/Release), so whatever the releasing thread did with its slot (say, removing a
/// container's record) is visible to the one that takes it next.
#[derive(Debug)]
pub struct BoundedCounter {
    taken: AtomicU32,
    limit: u32,
}

impl BoundedCounter {
    /// An empty counter with `limit` slots (`u32::MAX` for "no limit").
    pub fn new(limit: u32) -> BoundedCounter {
        BoundedCounter::with_taken(0, limit)
    }

    /// A counter with `taken` slots already taken (say, re-adopted from a checkpoint), which
    /// may exceed `limit` when the limit was lowered: then nothing more is admitted until
    /// enough are released.
    pub fn with_taken(taken: u32, limit: u32) -> BoundedCounter {
        BoundedCounter {
            taken: AtomicU32::new(taken),
            limit,
        }
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Slots taken now (a moment's value: it may change right after).
    pub fn taken(&self) -> u32 {
        self.taken.load(Ordering::Acquire)
    }

    /// Takes one slot; returns how many are taken with it.
    ///
    /// # Errors
    /// [`AtLimit`] when all `limit` slots are taken; nothing changes.
    pub fn try_acquire(&self) -> Result<u32, AtLimit> {
        let mut cur = self.taken.load(Ordering::Relaxed);
        loop {
            if cur >= self.limit {
                return Err(AtLimit { limit: self.limit });
            }
            match self.taken.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur + 1),
                Err(now) => cur = now,
            }
        }
    }

    /// Frees one slot; returns how many stay taken.
    ///
    /// # Errors
    /// [`Underflow`] when no slot is taken; nothing changes.
    pub fn release(&self) -> Result<u32, Underflow> {
        let mut cur = self.taken.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return Err(Underflow);
            }
            match self.taken.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur - 1),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(all(test, not(gpushare_loom)))]
mod tests {
    use super::*;

    #[test]
    fn never_passes_the_limit_nor_zero() {
        let c = BoundedCounter::new(2);
        assert_eq!(c.release(), Err(Underflow));
        assert_eq!(c.try_acquire(), Ok(1));
        assert_eq!(c.try_acquire(), Ok(2));
        assert_eq!(c.try_acquire(), Err(AtLimit { limit: 2 }));
        assert_eq!(c.taken(), 2);
        assert_eq!(c.release(), Ok(1));
        assert_eq!(c.try_acquire(), Ok(2));
        assert_eq!(c.release(), Ok(1));
        assert_eq!(c.release(), Ok(0));
        assert_eq!(c.release(), Err(Underflow));
        assert_eq!(c.taken(), 0);
    }

    #[test]
    fn over_limit_after_adoption_admits_nothing_until_below() {
        let c = BoundedCounter::with_taken(3, 2);
        assert!(c.try_acquire().is_err());
        assert_eq!(c.release(), Ok(2));
        assert!(c.try_acquire().is_err());
        assert_eq!(c.release(), Ok(1));
        assert_eq!(c.try_acquire(), Ok(2));
    }

    #[test]
    fn many_threads_never_overshoot() {
        let c = std::sync::Arc::new(BoundedCounter::new(5));
        let max_seen = std::sync::Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = std::sync::Arc::clone(&c);
                let max_seen = std::sync::Arc::clone(&max_seen);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Ok(n) = c.try_acquire() {
                            max_seen.fetch_max(n, Ordering::Relaxed);
                            c.release().expect("a taken slot releases");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("worker");
        }
        assert!(max_seen.load(Ordering::Relaxed) <= 5);
        assert_eq!(c.taken(), 0);
    }
}
