//! A split's shuffle buffer: `shuffle.buffer` items held, a seeded draw picks which leaves when
//! one more arrives, and the rest leave in drawn order when the split ends.
//!
//! The draws depend only on how many items the buffer holds, never on what they are, so the
//! same buffer gives the same order whether it holds computed elements (in the assembler) or the
//! elements as read, before any stage (in the reader, when the plan shuffles first: see
//! [`super::Plan::shuffles_first`]).

use super::{Plan, Task};
use crate::seed::{SeededRng, Stream};
use crate::source::{Split, SplitKind};

/// The shuffle buffer of one split of one epoch.
pub(super) struct ShuffleBuffer<T> {
    rng: SeededRng,
    held: Vec<T>,
    size: usize,
}

impl<T> ShuffleBuffer<T> {
    /// The buffer of split `split_id` in `task`'s epoch; `None` when the plan keeps the order.
    pub(super) fn new(plan: &Plan, task: Task, split_id: u64) -> Option<ShuffleBuffer<T>> {
        (plan.shuffle_buffer > 0).then(|| ShuffleBuffer {
            rng: SeededRng::new(plan.seed, Stream::Shuffle, &[u64::from(task.epoch), split_id]),
            held: Vec::with_capacity(plan.shuffle_buffer.min(1 << 16)),
            size: plan.shuffle_buffer,
        })
    }

    /// Takes `item` in; once the buffer is over its size, gives back the item drawn to leave.
    pub(super) fn push(&mut self, item: T) -> Option<T> {
        self.held.push(item);
        (self.held.len() > self.size).then(|| self.draw())
    }

    /// The next item to leave once the split has ended; `None` when the buffer is empty.
    pub(super) fn drain(&mut self) -> Option<T> {
        (!self.held.is_empty()).then(|| self.draw())
    }

    fn draw(&mut self) -> T {
        let i = self.rng.below(self.held.len() as u64) as usize;
        self.held.swap_remove(i)
    }
}

impl ShuffleBuffer<u64> {
    /// The positions `0..n` in the order this buffer lets them leave: the order of a split of
    /// `n` elements, known before any of them is read.
    pub(super) fn order(mut self, n: u64) -> Vec<u64> {
        let mut order = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for position in 0..n {
            order.extend(self.push(position));
        }
        while let Some(position) = self.drain() {
            order.push(position);
        }
        order
    }
}

/// `split` with its files in the order `task`'s shuffle buffer lets them leave, and that order
/// (`order[k]` is the position in `split` of the k-th file of the result): a `files` split's
/// count is known before any file is read, so it can be read shuffled. `None` for other
/// splits, and when the plan keeps the order.
pub(super) fn files_in_shuffled_order(
    plan: &Plan,
    task: Task,
    split_id: u64,
    split: &Split,
) -> Option<(Vec<u64>, Split)> {
    let SplitKind::Files(samples) = &split.kind else { return None };
    let order = ShuffleBuffer::<u64>::new(plan, task, split_id)?.order(samples.len() as u64);
    let samples = order.iter().filter_map(|&i| samples.get(i as usize).cloned()).collect();
    Some((order, Split { kind: SplitKind::Files(samples), ..split.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(buffer: usize) -> Plan {
        Plan {
            stages: Vec::new(),
            seed: 7,
            batch_size: 4,
            padding: None,
            bucketing: None,
            shuffle_buffer: buffer,
            shuffle_first: true,
            spec_stages: 0,
            cache: None,
            skip_errors: false,
            client_images: None,
        }
    }

    #[test]
    fn the_order_of_positions_is_the_order_elements_leave_in() {
        let task = Task::compute(1, 3);
        for (buffer, n) in [(1, 10), (4, 10), (10, 10), (64, 10), (3, 0)] {
            let plan = plan(buffer);
            let order = ShuffleBuffer::<u64>::new(&plan, task, 3).map(|b| b.order(n)).unwrap_or_default();
            // The same draws over elements that carry their position.
            let mut elements = ShuffleBuffer::<(u64, String)>::new(&plan, task, 3).expect("a buffer");
            let mut left = Vec::new();
            for i in 0..n {
                left.extend(elements.push((i, format!("element {i}"))).map(|(i, _)| i));
            }
            while let Some((i, _)) = elements.drain() {
                left.push(i);
            }
            assert_eq!(order, left, "buffer {buffer}, {n} elements");
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
        }
    }
}
