//! Local work spread over a few threads where a node's size makes it worth it: the store's
//! read-back of every record and the start-up reconcile's pass over every claim, whose file
//! reads and checks are most of a restart on a node holding many claims. Pure plumbing: the
//! results come back in the items' order, so what runs in parallel decides nothing.

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
