//! Transactions over the registry that undo themselves unless committed: a change is made in
//! memory, each step registering how to undo it; committing writes it durably, and a failed
//! write, an early return or a panic runs every undo step (newest first) under the registry
//! lock, then the steps that must run without it (releasing GPUs through their mode words,
//! which may restore settings over NVML).
//!
//! Declare the transaction before taking the registry's lock guard, so that on an early
//! return the guard is dropped first (locals drop in reverse order) and the undo can take the
//! lock.

use std::ops::DerefMut;

/// What a transaction works on: something with a lock around its state.
pub(crate) trait Registry {
    /// The state under the lock.
    type State;
    /// The lock guard.
    type Guard<'g>: DerefMut<Target = Self::State>
    where
        Self: 'g;
    /// Takes the lock.
    fn lock(&self) -> Self::Guard<'_>;
}

type Undo<'a, S> = Box<dyn FnOnce(&mut S) + 'a>;
type After<'a> = Box<dyn FnOnce() + 'a>;

/// A change under way; see the module docs.
#[must_use = "a transaction that is dropped undoes its change"]
pub(crate) struct Txn<'a, R: Registry + ?Sized> {
    registry: &'a R,
    undo: Vec<Undo<'a, R::State>>,
    after: Vec<After<'a>>,
    done: bool,
}

impl<R: Registry + ?Sized> std::fmt::Debug for Txn<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txn")
            .field("undo_steps", &self.undo.len())
            .field("done", &self.done)
            .finish()
    }
}

impl<'a, R: Registry + ?Sized> Txn<'a, R> {
    /// Begins a transaction on `registry`.
    pub fn begin(registry: &'a R) -> Txn<'a, R> {
        Txn {
            registry,
            undo: Vec::new(),
            after: Vec::new(),
            done: false,
        }
    }

    /// Registers how to undo the step just made, under the registry lock.
    pub fn on_undo(&mut self, f: impl FnOnce(&mut R::State) + 'a) {
        self.undo.push(Box::new(f));
    }

    /// Registers what to do after the undo steps, with the registry unlocked.
    pub fn after_undo(&mut self, f: impl FnOnce() + 'a) {
        self.after.push(Box::new(f));
    }

    /// Makes the change durable with `write` (which unlocks the registry and writes); when
    /// it fails, the change is undone and its error returned.
    ///
    /// # Errors
    /// `write`'s error, after the undo.
    pub fn commit<G, E>(
        mut self,
        guard: G,
        write: impl FnOnce(G) -> Result<(), E>,
    ) -> Result<(), E> {
        match write(guard) {
            Ok(()) => {
                self.done = true;
                Ok(())
            }
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }

    /// Keeps the change without a durable write (what it changed is not durable state, or
    /// the caller wrote it already).
    pub fn keep(mut self) {
        self.done = true;
    }

    fn rollback(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        {
            let mut state = self.registry.lock();
            while let Some(f) = self.undo.pop() {
                f(&mut state);
            }
        }
        for f in self.after.drain(..) {
            f();
        }
    }
}

impl<R: Registry + ?Sized> Drop for Txn<'_, R> {
    fn drop(&mut self) {
        self.rollback();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::{Mutex, MutexGuard};

    struct Reg(Mutex<Vec<u32>>);

    impl Registry for Reg {
        type State = Vec<u32>;
        type Guard<'g> = MutexGuard<'g, Vec<u32>>;
        fn lock(&self) -> MutexGuard<'_, Vec<u32>> {
            self.0.lock().unwrap()
        }
    }

    fn push(r: &Reg, tx: &mut Txn<'_, Reg>, v: u32) {
        r.lock().push(v);
        tx.on_undo(move |s| {
            let at = s.iter().position(|x| *x == v).unwrap();
            s.remove(at);
        });
    }

    #[test]
    fn a_failed_write_undoes_every_step_newest_first_then_runs_the_after_steps() {
        let r = Reg(Mutex::new(vec![1]));
        let order = RefCell::new(Vec::new());
        let mut tx = Txn::begin(&r);
        push(&r, &mut tx, 2);
        push(&r, &mut tx, 3);
        tx.after_undo(|| order.borrow_mut().push("after"));
        let guard = r.lock();
        let e = tx.commit(guard, |g| {
            drop(g);
            Err("disk full")
        });
        assert_eq!(e, Err("disk full"));
        assert_eq!(*r.lock(), vec![1]);
        assert_eq!(*order.borrow(), vec!["after"]);
    }

    #[test]
    fn a_committed_change_stays_and_a_dropped_one_is_undone() {
        let r = Reg(Mutex::new(vec![]));
        let mut tx = Txn::begin(&r);
        push(&r, &mut tx, 7);
        let guard = r.lock();
        tx.commit(guard, |g| {
            drop(g);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(*r.lock(), vec![7]);
        {
            let mut tx = Txn::begin(&r);
            push(&r, &mut tx, 8);
            // An early return: dropped without a commit.
        }
        assert_eq!(*r.lock(), vec![7]);
        let mut tx = Txn::begin(&r);
        push(&r, &mut tx, 9);
        tx.keep();
        assert_eq!(*r.lock(), vec![7, 9]);
    }
}
