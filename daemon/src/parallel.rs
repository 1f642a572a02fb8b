//! Work spread over threads, two kinds. [`map`]: local work on a few threads where a node's
//! size makes it worth it (the store's read-back of every record and the start-up reconcile's
//! pass over every claim, whose file reads and checks are most of a restart on a node holding
//! many claims), results in the items' order. [`in_parallel`]: work that waits (on MPS
//! control daemons, each step bounded by the MPS timeout), one thread per item up to
//! [`RECONCILE_THREADS`], so a start takes as long as its slowest claim. Pure plumbing: what
//! runs in parallel decides nothing.

/// Fewest items worth a thread of their own: below it, starting the thread costs more than it
/// saves.
pub const MIN_PER_THREAD: usize = 128;

/// Most threads used at once (the work is a daemon's start, not a batch job: it leaves the
/// rest of a large machine alone).
pub const MAX_THREADS: usize = 4;

/// Threads for CPU- and file-bound work over `n` items: the machine's parallelism, at most
/// [`MAX_THREADS`], and no more than one per [`MIN_PER_THREAD`] items (at least one).
pub fn threads_for(n: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_THREADS)
        .min(n / MIN_PER_THREAD)
        .max(1)
}

/// `f` of every item, in the items' order, on up to [`threads_for`] threads, each taking one
/// contiguous share. A share whose thread cannot be started is done on this thread; a panic
/// in `f` is resumed here.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads_for(items.len());
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let f = &f;
    let share = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let started: Vec<_> = items
            .chunks(share)
            .map(|part| {
                let job = move || part.iter().map(f).collect::<Vec<R>>();
                let handle = std::thread::Builder::new()
                    .name("gpushared-par".into())
                    .spawn_scoped(s, job);
                (part, handle)
            })
            .collect();
        started
            .into_iter()
            .flat_map(|(part, handle)| match handle {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => part.iter().map(f).collect(),
            })
            .collect()
    })
}

/// Most threads [`in_parallel`] runs work that waits on MPS control daemons on at once: the
/// start-up reconcile's claims (and orphan MPS daemons). A
/// node has at most a few dozen MPS control daemons (one per GPU, or per MIG slice), so all
/// of them are stopped or restarted at once and the reconcile takes about as long as its
/// slowest claim, whose every step is bounded by the MPS timeout, however many there are.
pub const RECONCILE_THREADS: usize = 64;

/// Runs `work` on every item, on up to [`RECONCILE_THREADS`] threads at once (inline for a
/// single item, or when no thread can be started), and returns when all are done.
pub fn in_parallel<T: Sync>(items: &[T], work: impl Fn(&T) + Sync) {
    if items.len() <= 1 {
        items.iter().for_each(&work);
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let run = || loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(item) = items.get(i) else { return };
        work(item);
    };
    std::thread::scope(|s| {
        for n in 0..items.len().min(RECONCILE_THREADS) {
            let spawned = std::thread::Builder::new()
                .name(format!("reconcile-{n}"))
                .spawn_scoped(s, run);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start another reconcile thread; going on with those running");
                break;
            }
        }
        // Whatever no thread took (none could be started) is done here.
        run();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_items_order_however_many_threads() {
        for n in [0, 1, MIN_PER_THREAD - 1, MIN_PER_THREAD * 3 + 7, 5000] {
            let items: Vec<usize> = (0..n).collect();
            let got = map(&items, |i| i * 2);
            assert_eq!(got, items.iter().map(|i| i * 2).collect::<Vec<_>>(), "{n}");
        }
    }

    #[test]
    fn few_items_stay_on_one_thread() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(MIN_PER_THREAD - 1), 1);
        assert!(threads_for(1_000_000) <= MAX_THREADS);
        // Work on a handful of items never leaves the calling thread.
        let me = std::thread::current().id();
        let ids = map(&[1, 2, 3], |_| std::thread::current().id());
        assert!(ids.iter().all(|id| *id == me));
    }

    #[test]
    #[should_panic(expected = "boom")]
    fn a_panic_in_a_share_reaches_the_caller() {
        let items: Vec<usize> = (0..MIN_PER_THREAD * 4).collect();
        map(&items, |i| {
            assert!(*i != MIN_PER_THREAD * 3, "boom");
        });
    }
}
