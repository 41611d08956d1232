//! The finisher joins complete slots into batches ahead of the trainer, off its thread.
//!
//! Joining a slot is where the client spends its time per batch: the parts' rows are copied
//! into one buffer, a final `image.normalize` the worker left to the client writes the batch's
//! `float32` values (128 ImageNet images at 224×224: 19 MB in, 77 MB out), and padded fields are
//! padded. Done inside `next()`, that time was the trainer's, whenever a call completed a slot;
//! and at an epoch's start, where every slot held for the epoch completed at once, it waited
//! for all of them in a row (0.5–1 s with 200 ms steps on the float32 training recipe).
//!
//! Here a slot is joined as soon as it completes, on the runtime's blocking threads, at most
//! [`FINISHING_AT_ONCE`] at a time and in completion order (the semaphore is fair), so the
//! first of a burst is ready after one join and not after all of them. `next()` takes them in
//! that order. A slot whose join costs nothing worth a thread hop (one part, nothing to
//! normalize or pad) is joined at once.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::assembler::Complete;
use crate::batch::{Arrived, Batch};

/// Slots joined at once: two, so that a trainer host gives the joins at most two cores, and a
/// burst of slots completing together (an epoch's start) is joined two at a time.
const FINISHING_AT_ONCE: usize = 2;

/// A slot taken from the assembler, being joined or joined.
#[derive(Debug)]
struct Finishing {
    epoch: u32,
    slot: u64,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    Joining(JoinHandle<Result<Batch, String>>),
    Joined(Result<Batch, String>),
}

/// A joined slot, for `next()` to return (or to report, when its parts did not join).
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) epoch: u32,
    pub(crate) slot: u64,
    pub(crate) batch: Result<Batch, String>,
}

/// Complete slots in completion order, each joined in the background.
#[derive(Debug)]
pub(crate) struct Finisher {
    queue: VecDeque<Finishing>,
    permits: Arc<Semaphore>,
}

impl Finisher {
    /// A finisher with nothing to join.
    pub(crate) fn new() -> Finisher {
        Finisher { queue: VecDeque::new(), permits: Arc::new(Semaphore::new(FINISHING_AT_ONCE)) }
    }

    /// Slots taken and not yet handed on, joined or not.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Starts joining `complete`: at once when that is cheap, else on a blocking thread once one
    /// of the permits is free. Must run within a Tokio runtime.
    pub(crate) fn push(&mut self, complete: Complete) {
        let Complete { epoch, slot, parts } = complete;
        let stage = if costly(&parts) {
            let permits = Arc::clone(&self.permits);
            Stage::Joining(tokio::spawn(async move {
                // Never closed: `acquire_owned` fails only on a closed semaphore.
                let permit = permits.acquire_owned().await.ok();
                let joined = tokio::task::spawn_blocking(move || {
                    let batch = Batch::from_arrived(epoch, slot, parts);
                    drop(permit);
                    batch
                })
                .await;
                joined.unwrap_or_else(|e| Err(format!("joining the batch's parts failed: {e}")))
            }))
        } else {
            Stage::Joined(Batch::from_arrived(epoch, slot, parts))
        };
        self.queue.push_back(Finishing { epoch, slot, stage });
    }

    /// The oldest slot, once joined; `None` when there is none. Cancel-safe: dropped while it
    /// waits, the slot stays first and its join goes on.
    pub(crate) async fn next(&mut self) -> Option<Finished> {
        let head = self.queue.front_mut()?;
        if let Stage::Joining(handle) = &mut head.stage {
            let joined = handle.await;
            head.stage = Stage::Joined(
                joined.unwrap_or_else(|e| Err(format!("joining the batch's parts stopped: {e}"))),
            );
        }
        let Finishing { epoch, slot, stage } = self.queue.pop_front()?;
        let batch = match stage {
            Stage::Joined(batch) => batch,
            // Replaced just above.
            Stage::Joining(_) => Err("joining the batch's parts did not finish".to_string()),
        };
        Some(Finished { epoch, slot, batch })
    }
}

/// Whether joining `parts` is worth a thread: more than one part (their rows are copied into
/// one buffer), or a tensor to normalize or pad. One part as it came is used as is.
fn costly(parts: &[Arrived]) -> bool {
    parts.len() > 1
        || parts.iter().any(|a| a.part.tensors.iter().any(|t| t.normalize.is_some() || t.padding.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::v1::{BatchPart, Normalize, Tensor};

    /// A part of `rows` 2×2 RGB `uint8` images at rows `lo..lo+rows` of split 0, left for the
    /// client to normalize when `normalize` is set.
    fn part(epoch: u32, slot: u64, lo: u64, rows: u64, normalize: bool) -> Arrived {
        let pixels = usize::try_from(rows * 12).unwrap_or(0);
        Arrived::from(BatchPart {
            epoch,
            slot,
            split: 0,
            lo,
            hi: lo + rows,
            keys: (lo..lo + rows).map(|i| format!("k{i}")).collect(),
            tensors: vec![Tensor {
                name: "image".into(),
                dtype: "uint8".into(),
                shape: vec![rows, 2, 2, 3],
                data: (0..pixels).map(|i| i as u8).collect::<Vec<_>>().into(),
                normalize: normalize.then(|| Normalize {
                    mean: vec![0.5, 0.5, 0.5],
                    std: vec![0.25, 0.25, 0.25],
                    layout: "CHW".into(),
                }),
                padding: None,
                images: None,
            }],
        })
    }

    #[tokio::test]
    async fn slots_come_out_joined_in_completion_order_whatever_they_cost() {
        let mut finisher = Finisher::new();
        let slots = [
            (3, vec![part(1, 3, 0, 2, true)]),
            (0, vec![part(1, 0, 2, 1, false)]),
            (7, vec![part(1, 7, 3, 1, false), part(1, 7, 4, 2, false)]),
            (1, Vec::new()),
        ];
        for (slot, parts) in slots.iter().cloned() {
            finisher.push(Complete { epoch: 1, slot, parts: parts.clone() });
        }
        assert_eq!(finisher.len(), 4);
        for (slot, parts) in slots {
            let finished = finisher.next().await.expect("a slot was pushed");
            assert_eq!((finished.epoch, finished.slot), (1, slot));
            let direct = Batch::from_arrived(1, slot, parts).expect("the parts join");
            let batch = finished.batch.expect("the parts join in the background too");
            assert_eq!(batch.keys, direct.keys);
            assert_eq!(batch.tensors, direct.tensors, "the same bytes as a join in place");
        }
        assert!(finisher.next().await.is_none());
        assert_eq!(finisher.len(), 0);
    }

    #[tokio::test]
    async fn a_join_that_fails_is_reported_with_its_slot() {
        let mut finisher = Finisher::new();
        let mut bad = part(0, 5, 0, 1, false);
        bad.part.tensors[0].dtype = "int32".into();
        finisher.push(Complete { epoch: 0, slot: 5, parts: vec![part(0, 5, 1, 1, false), bad] });
        let finished = finisher.next().await.expect("a slot was pushed");
        assert_eq!(finished.slot, 5);
        assert!(finished.batch.is_err(), "parts of different dtypes do not join");
    }

    #[test]
    fn only_joins_that_copy_normalize_or_pad_take_a_thread() {
        assert!(!costly(&[]));
        assert!(!costly(&[part(0, 0, 0, 4, false)]));
        assert!(costly(&[part(0, 0, 0, 4, true)]));
        assert!(costly(&[part(0, 0, 0, 2, false), part(0, 0, 2, 2, false)]));
    }
}
