//! loom models of gpushare-core's primitives: every interleaving (within the preemption bound)
//! of two or three threads, each asserting the invariant its primitive exists for.
//!
//! Run them with `./scripts/loom.sh` (CONTRIBUTING.md). Each model records the mutations that
//! were tried on the primitive — each one removing part of the protection or weakening one
//! memory ordering — and what loom said (loom 0.7.3, preemption bound 3); every one fails its
//! model, and the code as committed passes.
#![cfg(gpushare_loom)]

use gpushare_core::{GpuModeWord, Published, Released, Want};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Runs `f` under loom, bounded to 3 preemptions unless `LOOM_MAX_PREEMPTIONS` says otherwise
/// (every bug found in practice needs at most 2 or 3).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// A GPU: its mode word and the settings its holders apply (compute mode, time-slice
/// interval), which loom checks for data races like any unsynchronized memory.
struct Gpu {
    word: GpuModeWord,
    setting: UnsafeCell<u8>,
}

impl Gpu {
    fn new() -> Gpu {
        Gpu {
            word: GpuModeWord::new(),
            setting: UnsafeCell::new(0),
        }
    }

    fn apply(&self, tag: u8) {
        // SAFETY: only the first holder writes; in this model the word is what must make this
        // exclusive, and loom reports it when it does not.
        self.setting.with_mut(|p| unsafe { *p = tag });
    }

    fn read(&self) -> u8 {
        // SAFETY: see `apply`.
        self.setting.with(|p| unsafe { *p })
    }

    /// Releases `want`; the last holder restores the default setting before the GPU is free.
    fn release(&self, want: Want) {
        match self
            .word
            .release(want)
            .expect("a holder releases what it holds")
        {
            Released::Last(guard) => {
                self.apply(0);
                drop(guard);
            }
            Released::Shared { .. } => {}
        }
    }
}

/// Exclusive, MPS and time-slicing race for one GPU: at most one is admitted at a time, the
/// one admitted sees its own setting, and the previous holder's restore never lands on it.
///
/// Mutations tried (each fails):
/// - `try_acquire` split into a load and a plain `store` (no compare-and-swap): loom reports
///   "Causality violation: Concurrent write accesses to `UnsafeCell`" on `setting` (two
///   holders admitted at once).
/// - `try_acquire`'s success ordering `AcqRel` → `Release` (no Acquire): "Causality
///   violation: Concurrent write accesses to `UnsafeCell`": the new holder's apply races the
///   previous holder's restore.
/// - `LastHolder::drop` storing `FREE` with `Relaxed` instead of `Release`: the same
///   causality violation on `setting`.
/// - `leave` freeing the GPU at once (`Mode::Free` instead of `Mode::Restoring`, the last
///   holder still restoring afterwards): the restore races the next holder's apply, the same
///   causality violation.
#[test]
fn conflicting_modes_never_share_a_gpu() {
    model(|| {
        let gpu = Arc::new(Gpu::new());
        let threads: Vec<_> = [
            (Want::Exclusive, 1),
            (Want::Mps, 2),
            (Want::TimeSliced(1), 3),
        ]
        .into_iter()
        .map(|(want, tag)| {
            let gpu = Arc::clone(&gpu);
            thread::spawn(move || {
                if let Ok(admitted) = gpu.word.try_acquire(want) {
                    assert!(admitted.first, "{want:?} shared a GPU");
                    gpu.apply(tag);
                    assert_eq!(gpu.read(), tag, "{want:?} lost its setting");
                    gpu.release(want);
                }
            })
        })
        .collect();
        for t in threads {
            t.join().expect("model thread");
        }
        assert_eq!(gpu.word.load(), gpushare_core::Mode::Free);
    });
}

/// Two claims time-slicing at one interval share the GPU; a third at another interval is
/// never admitted while either holds it.
///
/// Mutations tried (each fails):
/// - `admit` ignoring the interval (`interval == asked` removed): the interval-2 claim joins
///   the interval-1 holders and loom finds the panic "a holder releases what it holds:
///   NotHeld { mode: TimeSliced { interval: 1, holders: 2 }, want: TimeSliced(2) }" (or, in
///   other interleavings, "other interval held while admitted").
/// - both compare-and-swaps (`try_acquire`, `release`) with `Relaxed` success ordering:
///   "Causality violation: Concurrent write accesses to `UnsafeCell`" (the next first
///   holder's apply races the previous last holder's restore).
#[test]
fn time_slicing_shares_one_interval_only() {
    model(|| {
        let gpu = Arc::new(Gpu::new());
        let holding = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let threads: Vec<_> = [1u8, 1, 2]
            .into_iter()
            .map(|interval| {
                let gpu = Arc::clone(&gpu);
                let holding = Arc::clone(&holding);
                thread::spawn(move || {
                    let want = Want::TimeSliced(interval);
                    let mine = usize::from(interval - 1);
                    let Ok(admitted) = gpu.word.try_acquire(want) else {
                        return;
                    };
                    // Relaxed on purpose: only the word's ordering may make these visible.
                    holding[mine].fetch_add(1, Ordering::Relaxed);
                    assert_eq!(
                        holding[1 - mine].load(Ordering::Relaxed),
                        0,
                        "other interval held while admitted"
                    );
                    if admitted.first {
                        gpu.apply(interval);
                    }
                    holding[mine].fetch_sub(1, Ordering::Relaxed);
                    gpu.release(want);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("model thread");
        }
        assert_eq!(gpu.word.load(), gpushare_core::Mode::Free);
    });
}

/// A publisher replaces the snapshot twice while two readers read (one of them twice): every
/// read is one whole published snapshot (both halves equal), and no reader goes back in time.
///
/// Mutations tried (each fails):
/// - reader registers with `Relaxed` instead of `Acquire`: "Causality violation: Concurrent
///   read and write accesses" (the reader's read of the slot races the publisher's write).
/// - reader leaves with `Relaxed` instead of `Release`: "Causality violation: Concurrent read
///   and write accesses to `UnsafeCell`" (the publisher's emptying of the slot races the
///   reader's read).
/// - publisher flips `CURRENT` with `Relaxed` instead of `Release`: "Causality violation:
///   Concurrent read and write accesses".
/// - publisher not waiting for readers of the retired slot (the `while` loop removed):
///   "Causality violation: Concurrent read and write accesses to `UnsafeCell`".
#[test]
fn readers_never_see_half_a_snapshot() {
    model(|| {
        let published = Arc::new(Published::new((0u32, 0u32)));
        let publisher = {
            let published = Arc::clone(&published);
            thread::spawn(move || {
                published.publish((1, 1));
                published.publish((2, 2));
            })
        };
        // One reader reads twice (going back in time needs two reads), the other once: a
        // second double reader multiplies the interleavings (and CI time) by about ten
        // without reaching a state this one does not.
        let readers: Vec<_> = [2, 1]
            .into_iter()
            .map(|reads| {
                let published = Arc::clone(&published);
                thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..reads {
                        let seen = published.load();
                        assert_eq!(seen.0, seen.1, "half a snapshot");
                        assert!(seen.0 >= last, "a reader went back in time");
                        last = seen.0;
                    }
                })
            })
            .collect();
        publisher.join().expect("publisher");
        for r in readers {
            r.join().expect("reader");
        }
        assert_eq!(*published.load(), (2, 2));
    });
}
