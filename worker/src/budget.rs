//! A byte budget that bounds the data in flight: readers wait for room, permits travel with the
//! data they account for and give their bytes back when dropped.
//!
//! Every element's permit is re-sized once and dropped once, from the compute threads and the
//! assembler, so a release must cost no more than the lock: it wakes the waiting readers only
//! when there are some and the release made room for them. (A condition variable's
//! `notify_all` is a `futex` system call even when nobody waits; on the Parquet pipeline's 250k
//! rows/s, those calls were 5% of all CPU time.)

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    used: usize,
    peak: usize,
    closed: bool,
    /// Readers waiting in [`Budget::acquire`] for room.
    waiting: usize,
}

/// Shared byte budget.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    state: Mutex<State>,
    room: Condvar,
}

/// Bytes held against a [`Budget`]; released on drop.
#[derive(Debug)]
pub struct Permit {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Budget {
    /// A budget of `limit` bytes (at least 1).
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget { limit: limit.max(1), state: Mutex::new(State::default()), room: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked while counting; the counts stay
        // meaningful, so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until some room is free, then takes `bytes` (which may overshoot the limit by one
    /// item, so that an item larger than the whole budget still moves). `None` once closed.
    pub fn acquire(self: &Arc<Self>, bytes: usize) -> Option<Permit> {
        let mut state = self.lock();
        while !state.closed && state.used >= self.limit {
            state.waiting += 1;
            state = self.room.wait(state).unwrap_or_else(|e| e.into_inner());
            state.waiting -= 1;
        }
        if state.closed {
            return None;
        }
        state.used += bytes;
        state.peak = state.peak.max(state.used);
        Some(Permit { budget: Arc::clone(self), bytes })
    }

    /// Takes `bytes` without waiting: for data that already exists and must move on.
    pub fn force(self: &Arc<Self>, bytes: usize) -> Permit {
        let mut state = self.lock();
        state.used += bytes;
        state.peak = state.peak.max(state.used);
        Permit { budget: Arc::clone(self), bytes }
    }

    /// Wakes every waiter and makes further `acquire` calls return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }

    /// Bytes currently held.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// Most bytes ever held at once.
    pub fn peak(&self) -> usize {
        self.lock().peak
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut state = self.lock();
        state.used = state.used.saturating_sub(bytes);
        // Waiters look at `used` under the lock before they sleep, and count themselves then:
        // one that is not counted yet will see the room this release made.
        let wake = state.waiting > 0 && state.used < self.limit;
        drop(state);
        if wake {
            self.room.notify_all();
        }
    }

    /// Readers waiting for room now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting
    }
}

impl Permit {
    /// Re-sizes the permit to `bytes` (the data grew or shrank), without waiting.
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            let mut state = self.budget.lock();
            state.used += bytes - self.bytes;
            state.peak = state.peak.max(state.used);
        } else {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }

    /// Merges `other` into this permit.
    pub fn absorb(&mut self, mut other: Permit) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_for_room_and_releases_on_drop() {
        let budget = Budget::new(100);
        let a = budget.acquire(80).unwrap();
        let b = budget.acquire(80).unwrap(); // room was free: overshoot by one item
        assert_eq!(budget.used(), 160);
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.acquire(10).map(|p| p.bytes()))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished());
        drop(a);
        drop(b);
        assert_eq!(waiter.join().unwrap(), Some(10));
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 160);
    }

    /// Waits (at most 10 s) until `n` readers wait on `budget`.
    fn until_waiting(budget: &Budget, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while budget.waiting() != n {
            assert!(std::time::Instant::now() < deadline, "{} readers wait, not {n}", budget.waiting());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn releases_that_leave_no_room_keep_readers_waiting_and_the_first_that_makes_room_wakes_all() {
        let budget = Budget::new(100);
        let mut held = budget.force(150);
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let budget = Arc::clone(&budget);
                std::thread::spawn(move || budget.acquire(10))
            })
            .collect();
        until_waiting(&budget, 3);
        held.resize(120);
        held.resize(100);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(budget.waiting(), 3, "a release that left the budget full woke a reader");
        assert!(readers.iter().all(|r| !r.is_finished()));
        held.resize(50);
        let permits: Vec<Permit> = readers.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
        assert_eq!(budget.waiting(), 0);
        assert_eq!(budget.used(), 80);
        drop(held);
        drop(permits);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn close_wakes_waiters_and_resize_counts() {
        let budget = Budget::new(10);
        let mut p = budget.force(10);
        p.resize(30);
        assert_eq!(budget.used(), 30);
        p.resize(5);
        assert_eq!(budget.used(), 5);
        let mut q = budget.force(20);
        q.absorb(p);
        assert_eq!(q.bytes(), 25);
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.acquire(1).is_none())
        };
        std::thread::sleep(Duration::from_millis(20));
        budget.close();
        assert!(waiter.join().unwrap());
        drop(q);
        assert_eq!(budget.used(), 0);
    }
}
