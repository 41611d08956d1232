//! The queue from the reader to the compute threads, refilled in halves.
//!
//! The reader is usually ahead, so the queue is usually full. A plain bounded channel then
//! wakes the reader for every slot a compute thread frees: it spins, parks, and is woken again
//! for each element, which on a busy machine takes cores from the compute threads (on the
//! Parquet pipeline, 13% of all CPU samples were the reader spinning in `send`). Here a reader
//! that finds the queue full sleeps until the compute threads have taken it down to half, then
//! refills it in one run.

use crossbeam_channel::{Receiver, RecvError, Sender, TrySendError, bounded};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The longest a full queue's reader sleeps before it looks again on its own, in case a wakeup
/// was missed or the compute threads have gone.
const RECHECK: Duration = Duration::from_millis(20);

/// Where a waiting reader sleeps.
struct Refill {
    /// Items left in the queue at which a waiting reader is woken.
    low: usize,
    /// A reader is asleep (or about to be) on `room`.
    waiting: AtomicBool,
    lock: Mutex<()>,
    room: Condvar,
    /// Times a taker woke the sleeping reader (a sleep that ran out is not counted: on a busy
    /// machine that depends on the scheduler), for tests.
    wakeups: AtomicU64,
}

/// The reader's end.
pub(super) struct Feeder<T> {
    tx: Sender<T>,
    refill: Arc<Refill>,
}

/// A compute thread's end.
pub(super) struct Taker<T> {
    rx: Receiver<T>,
    refill: Arc<Refill>,
}

impl<T> Clone for Taker<T> {
    fn clone(&self) -> Self {
        Taker { rx: self.rx.clone(), refill: Arc::clone(&self.refill) }
    }
}

/// A queue of `capacity` items whose full reader resumes when half of them are taken.
pub(super) fn queue<T>(capacity: usize) -> (Feeder<T>, Taker<T>) {
    let (tx, rx) = bounded(capacity.max(1));
    let refill = Arc::new(Refill {
        low: capacity / 2,
        waiting: AtomicBool::new(false),
        lock: Mutex::new(()),
        room: Condvar::new(),
        wakeups: AtomicU64::new(0),
    });
    (Feeder { tx, refill: Arc::clone(&refill) }, Taker { rx, refill })
}

impl<T> Feeder<T> {
    /// Queues `item`, waiting while the queue is full; gives it back when every taker is gone.
    pub(super) fn send(&self, mut item: T) -> Result<(), T> {
        loop {
            match self.tx.try_send(item) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(back)) => return Err(back),
                Err(TrySendError::Full(back)) => item = back,
            }
            let refill = &self.refill;
            let guard = refill.lock.lock().unwrap_or_else(PoisonError::into_inner);
            refill.waiting.store(true, Ordering::SeqCst);
            // Taken down to the mark between the failed send and here: no sleep.
            if self.tx.len() > refill.low {
                let (_guard, slept) =
                    refill.room.wait_timeout(guard, RECHECK).unwrap_or_else(PoisonError::into_inner);
                if !slept.timed_out() {
                    refill.wakeups.fetch_add(1, Ordering::Relaxed);
                }
            }
            refill.waiting.store(false, Ordering::SeqCst);
        }
    }

    /// Times a taker has woken the reader from a full queue.
    #[cfg(test)]
    fn wakeups(&self) -> u64 {
        self.refill.wakeups.load(Ordering::Relaxed)
    }
}

impl<T> Taker<T> {
    /// The next item, waiting for one; an error once the queue is empty and the reader gone.
    pub(super) fn recv(&self) -> Result<T, RecvError> {
        let item = self.rx.recv();
        let refill = &self.refill;
        if refill.waiting.load(Ordering::SeqCst) && self.rx.len() <= refill.low {
            let _guard = refill.lock.lock().unwrap_or_else(PoisonError::into_inner);
            refill.room.notify_one();
        }
        item
    }

    /// Items in the queue.
    pub(super) fn len(&self) -> usize {
        self.rx.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_slow_taker_gets_every_item_in_order_and_wakes_the_reader_once_per_half_queue() {
        let (feeder, taker) = queue::<u32>(16);
        let reader = std::thread::spawn(move || {
            for i in 0..400 {
                feeder.send(i).unwrap();
            }
            feeder.wakeups()
        });
        let mut got = Vec::new();
        while let Ok(i) = taker.recv() {
            got.push(i);
            if got.len() % 4 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let wakeups = reader.join().unwrap();
        assert_eq!(got, (0..400).collect::<Vec<_>>());
        // 400 items through a queue of 16 refilled 8 at a time: about 50 wakeups, not 400.
        assert!(wakeups <= 400 / 8 + 2, "{wakeups} wakeups");
    }

    #[test]
    fn a_reader_on_a_full_queue_gets_its_item_back_once_the_takers_are_gone() {
        let (feeder, taker) = queue::<u32>(2);
        feeder.send(1).unwrap();
        feeder.send(2).unwrap();
        let start = Instant::now();
        let dropper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(taker);
        });
        assert_eq!(feeder.send(3), Err(3));
        assert!(start.elapsed() >= Duration::from_millis(30));
        dropper.join().unwrap();
    }

    #[test]
    fn a_queue_of_one_still_passes_items() {
        let (feeder, taker) = queue::<u32>(1);
        let reader = std::thread::spawn(move || (0..50).try_for_each(|i| feeder.send(i)));
        let got: Vec<u32> = std::iter::from_fn(|| taker.recv().ok()).collect();
        assert_eq!(reader.join().unwrap(), Ok(()));
        assert_eq!(got, (0..50).collect::<Vec<_>>());
    }
}
