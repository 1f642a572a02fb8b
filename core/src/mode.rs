//! One GPU's sharing mode in one atomic word, changed only by compare-and-swap.
//!
//! The rules are placement's (`daemon/src/placement.rs`): a GPU is free, held whole by one
//! claim, time-sliced by claims that all asked one interval, run by one claim's MPS control
//! daemon (EXCLUSIVE_PROCESS compute mode admits a single MPS server), or partitioned into
//! MIG instances held by any number of MIG claims. The word only counts holders; who they are
//! is the claim registry's business.
//!
//! Releasing the last holder does not free the GPU at once: the word goes to
//! [`Mode::Restoring`] and the caller gets a [`LastHolder`] guard, restores the GPU's
//! settings (time-slice Default, compute mode DEFAULT) without holding any lock, and only
//! dropping the guard frees the GPU. So a claim admitted next can never have its settings
//! overwritten by the previous holder's late restore.

use crate::sync::{AtomicU64, Ordering};

// Layout of the word: kind in bits 0..4, time-slice interval in bits 4..12, holders in bits
// 16..64.
const KIND_MASK: u64 = 0xf;
const FREE: u64 = 0;
const EXCLUSIVE: u64 = 1;
const TIME_SLICED: u64 = 2;
const MPS: u64 = 3;
const MIG: u64 = 4;
const RESTORING: u64 = 5;
const INTERVAL_SHIFT: u32 = 4;
const HOLDERS_SHIFT: u32 = 16;
const MAX_HOLDERS: u64 = (1 << (64 - HOLDERS_SHIFT)) - 1;

/// What a claim wants of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The whole GPU, unshared.
    Exclusive,
    /// Time-slicing at this interval (NVIDIA's code, 0–3: Default, Short, Medium, Long);
    /// claims share the GPU only at equal intervals.
    TimeSliced(u8),
    /// An MPS control daemon over it: one claim per GPU.
    Mps,
    /// MIG instances of it: any number of MIG claims.
    Mig,
}

/// A GPU's mode as the word holds it at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nobody holds it.
    Free,
    /// One claim holds it whole.
    Exclusive,
    /// `holders` claims time-slice it at `interval`.
    TimeSliced {
        /// NVIDIA's interval code, 0–3.
        interval: u8,
        /// Claims holding it, at least 1.
        holders: u64,
    },
    /// One claim's MPS control daemon runs over it.
    Mps,
    /// `holders` MIG claims hold instances of it.
    Mig {
        /// Claims holding it, at least 1.
        holders: u64,
    },
    /// Its last holder is restoring its settings; free once that is done.
    Restoring,
}

impl Mode {
    fn decode(word: u64) -> Mode {
        let holders = word >> HOLDERS_SHIFT;
        match word & KIND_MASK {
            EXCLUSIVE => Mode::Exclusive,
            TIME_SLICED => Mode::TimeSliced {
                interval: ((word >> INTERVAL_SHIFT) & 0xff) as u8,
                holders,
            },
            MPS => Mode::Mps,
            MIG => Mode::Mig { holders },
            RESTORING => Mode::Restoring,
            _ => Mode::Free,
        }
    }

    fn encode(self) -> u64 {
        match self {
            Mode::Free => FREE,
            Mode::Exclusive => EXCLUSIVE | 1 << HOLDERS_SHIFT,
            Mode::TimeSliced { interval, holders } => {
                TIME_SLICED | u64::from(interval) << INTERVAL_SHIFT | holders << HOLDERS_SHIFT
            }
            Mode::Mps => MPS | 1 << HOLDERS_SHIFT,
            Mode::Mig { holders } => MIG | holders << HOLDERS_SHIFT,
            Mode::Restoring => RESTORING,
        }
    }

    /// The mode after one more claim that wants `want` joins, if the rules allow it.
    fn admit(self, want: Want) -> Option<Mode> {
        match (self, want) {
            (Mode::Free, Want::Exclusive) => Some(Mode::Exclusive),
            (Mode::Free, Want::Mps) => Some(Mode::Mps),
            (Mode::Free, Want::TimeSliced(interval)) => Some(Mode::TimeSliced {
                interval,
                holders: 1,
            }),
            (Mode::Free, Want::Mig) => Some(Mode::Mig { holders: 1 }),
            (Mode::TimeSliced { interval, holders }, Want::TimeSliced(asked))
                if interval == asked && holders < MAX_HOLDERS =>
            {
                Some(Mode::TimeSliced {
                    interval,
                    holders: holders + 1,
                })
            }
            (Mode::Mig { holders }, Want::Mig) if holders < MAX_HOLDERS => Some(Mode::Mig {
                holders: holders + 1,
            }),
            _ => None,
        }
    }

    /// The mode after one holder that wanted `want` leaves (`Restoring` for the last one).
    fn leave(self, want: Want) -> Option<Mode> {
        match (self, want) {
            (Mode::Exclusive, Want::Exclusive) | (Mode::Mps, Want::Mps) => Some(Mode::Restoring),
            (Mode::TimeSliced { interval, holders }, Want::TimeSliced(asked))
                if interval == asked =>
            {
                Some(if holders <= 1 {
                    Mode::Restoring
                } else {
                    Mode::TimeSliced {
                        interval,
                        holders: holders - 1,
                    }
                })
            }
            (Mode::Mig { holders }, Want::Mig) => Some(if holders <= 1 {
                Mode::Restoring
            } else {
                Mode::Mig {
                    holders: holders - 1,
                }
            }),
            _ => None,
        }
    }
}

/// A claim was admitted to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// It is the first holder: the GPU was free, so its settings are the caller's to apply.
    pub first: bool,
}

/// `release` was asked for a mode the GPU is not held in; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the GPU is {mode:?}, not held as {want:?}")]
pub struct NotHeld {
    /// The mode found.
    pub mode: Mode,
    /// The release asked.
    pub want: Want,
}

/// What a release left.
#[derive(Debug)]
#[must_use = "dropping the LastHolder frees the GPU: restore its settings first"]
pub enum Released<'a> {
    /// Other claims still hold the GPU in the same mode.
    Shared {
        /// How many.
        holders: u64,
    },
    /// The caller was the last holder: restore the GPU's settings, then drop the guard.
    Last(LastHolder<'a>),
}

/// The last holder's hold on a GPU in [`Mode::Restoring`]; dropping it frees the GPU.
#[derive(Debug)]
pub struct LastHolder<'a> {
    word: &'a GpuModeWord,
}

impl Drop for LastHolder<'_> {
    fn drop(&mut self) {
        // Release: the restore this guard covered happens-before the next claim's admission
        // (whose compare-and-swap reads this store with Acquire) and so before it applies its
        // own settings.
        self.word.word.store(FREE, Ordering::Release);
    }
}

/// One GPU's sharing mode and holder count.
#[derive(Debug)]
pub struct GpuModeWord {
    word: AtomicU64,
}

impl Default for GpuModeWord {
    fn default() -> GpuModeWord {
        GpuModeWord::new()
    }
}

impl GpuModeWord {
    /// A free GPU.
    pub fn new() -> GpuModeWord {
        GpuModeWord {
            word: AtomicU64::new(FREE),
        }
    }

    /// The mode at this moment.
    pub fn load(&self) -> Mode {
        Mode::decode(self.word.load(Ordering::Acquire))
    }

    /// Admits one more claim that wants `want`, if the GPU's mode allows it.
    ///
    /// # Errors
    /// The mode that refused it (never [`Mode::Free`]); nothing changed.
    pub fn try_acquire(&self, want: Want) -> Result<Admitted, Mode> {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let mode = Mode::decode(cur);
            let next = mode.admit(want).ok_or(mode)?;
            // AcqRel on success: Acquire so a first holder applies its settings after the
            // previous holder's restore (LastHolder's Release store), Release so our use of the
            // GPU happens-before whoever releases it last and restores it.
            match self.word.compare_exchange_weak(
                cur,
                next.encode(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Ok(Admitted {
                        first: mode == Mode::Free,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Removes one holder that wanted `want`.
    ///
    /// # Errors
    /// [`NotHeld`] when the GPU is not held that way (a release without an acquire); nothing
    /// changed.
    pub fn release(&self, want: Want) -> Result<Released<'_>, NotHeld> {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let mode = Mode::decode(cur);
            let next = mode.leave(want).ok_or(NotHeld { mode, want })?;
            match self.word.compare_exchange_weak(
                cur,
                next.encode(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Ok(match next {
                        Mode::Restoring => Released::Last(LastHolder { word: self }),
                        Mode::TimeSliced { holders, .. } | Mode::Mig { holders } => {
                            Released::Shared { holders }
                        }
                        _ => unreachable!("leave yields Restoring or a shared mode"),
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(all(test, not(gpushare_loom)))]
mod tests {
    use super::*;

    #[test]
    fn exclusive_and_mps_admit_one_claim() {
        for want in [Want::Exclusive, Want::Mps] {
            let w = GpuModeWord::new();
            assert_eq!(w.try_acquire(want), Ok(Admitted { first: true }));
            for other in [Want::Exclusive, Want::Mps, Want::TimeSliced(0), Want::Mig] {
                assert!(w.try_acquire(other).is_err(), "{want:?} then {other:?}");
            }
            let Ok(Released::Last(guard)) = w.release(want) else {
                panic!("the only holder is the last");
            };
            assert_eq!(w.load(), Mode::Restoring);
            assert_eq!(w.try_acquire(want), Err(Mode::Restoring));
            drop(guard);
            assert_eq!(w.load(), Mode::Free);
        }
    }

    #[test]
    fn time_slicing_shares_one_interval_only() {
        let w = GpuModeWord::new();
        assert_eq!(
            w.try_acquire(Want::TimeSliced(1)),
            Ok(Admitted { first: true })
        );
        assert_eq!(
            w.try_acquire(Want::TimeSliced(1)),
            Ok(Admitted { first: false })
        );
        assert_eq!(
            w.try_acquire(Want::TimeSliced(3)),
            Err(Mode::TimeSliced {
                interval: 1,
                holders: 2
            })
        );
        assert!(w.try_acquire(Want::Mps).is_err());
        assert!(matches!(
            w.release(Want::TimeSliced(1)),
            Ok(Released::Shared { holders: 1 })
        ));
        assert_eq!(
            w.release(Want::TimeSliced(3)).map(|_| ()),
            Err(NotHeld {
                mode: Mode::TimeSliced {
                    interval: 1,
                    holders: 1
                },
                want: Want::TimeSliced(3)
            })
        );
        assert!(matches!(
            w.release(Want::TimeSliced(1)),
            Ok(Released::Last(_))
        ));
        assert_eq!(w.load(), Mode::Free);
    }

    #[test]
    fn mig_claims_share_and_release_without_acquire_is_refused() {
        let w = GpuModeWord::new();
        assert!(w.release(Want::Mig).is_err());
        assert_eq!(w.load(), Mode::Free);
        w.try_acquire(Want::Mig).expect("free GPU");
        w.try_acquire(Want::Mig).expect("MIG shares");
        assert_eq!(w.load(), Mode::Mig { holders: 2 });
        assert!(w.try_acquire(Want::TimeSliced(0)).is_err());
    }

    #[test]
    fn encoding_round_trips() {
        for m in [
            Mode::Free,
            Mode::Exclusive,
            Mode::Mps,
            Mode::Restoring,
            Mode::TimeSliced {
                interval: 3,
                holders: 1000,
            },
            Mode::Mig { holders: 7 },
        ] {
            assert_eq!(Mode::decode(m.encode()), m);
        }
    }
}
