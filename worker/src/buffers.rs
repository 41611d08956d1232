//! Recycled batch buffers.
//!
//! A float32 ImageNet batch is 77 MB. Allocated fresh for every batch, its pages are mapped
//! and zeroed by the kernel on first touch, which costs more than copying the pixels into it.
//! Dropped batches hand their buffers back here and the next batches reuse them, pages
//! already mapped. The pool is small and bounded, so memory held idle stays within a few
//! batches.

use std::sync::Mutex;

/// Buffers smaller than this are not worth keeping.
const MIN_BYTES: usize = 1 << 20;
/// Most buffers kept, and most bytes of capacity among them: a pipeline that finishes its batches
/// (see [`crate::batch::Finish`]) circulates buffers of two sizes, the `uint8` batches and their
/// `float32` form (616 MB for 1024 ImageNet images).
const MAX_BUFFERS: usize = 8;
const MAX_BYTES: usize = 2 << 30;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// The spare buffer that fits `need` best, by `size` (its capacity or its length), among those
/// no more than twice as large: a small batch does not take the buffer a large one needs, and
/// finds its own size again when it comes back.
fn best_fit(spare: &[Vec<u8>], need: usize, size: impl Fn(&Vec<u8>) -> usize) -> Option<usize> {
    spare
        .iter()
        .enumerate()
        .filter(|(_, b)| size(b) >= need && b.capacity() <= need.saturating_mul(2))
        .min_by_key(|(_, b)| size(b))
        .map(|(i, _)| i)
}

/// An empty buffer with room for at least `capacity` bytes, recycled when one is spare.
pub fn take(capacity: usize) -> Vec<u8> {
    if capacity >= MIN_BYTES
        && let Ok(mut spare) = SPARE.lock()
        && let Some(i) = best_fit(&spare, capacity, Vec::capacity)
    {
        let mut buffer = spare.swap_remove(i);
        buffer.clear();
        return buffer;
    }
    Vec::with_capacity(capacity)
}

/// A buffer of exactly `len` bytes for a caller that overwrites every one of them: recycled
/// with the bytes of a dropped batch where a spare one holds that many (no zero-fill; one
/// that only has the room is zero-filled past its bytes), else zeroed.
pub fn take_filled(len: usize) -> Vec<u8> {
    if len >= MIN_BYTES
        && let Ok(mut spare) = SPARE.lock()
        && let Some(i) = best_fit(&spare, len, Vec::len).or_else(|| best_fit(&spare, len, Vec::capacity))
    {
        let mut buffer = spare.swap_remove(i);
        buffer.resize(len, 0);
        return buffer;
    }
    vec![0; len]
}

/// Hands a buffer back for reuse; the oldest ones are dropped past the pool's bounds.
pub fn give(buffer: Vec<u8>) {
    if buffer.capacity() < MIN_BYTES {
        return;
    }
    let Ok(mut spare) = SPARE.lock() else { return };
    spare.push(buffer);
    while spare.len() > MAX_BUFFERS || spare.iter().map(Vec::capacity).sum::<usize>() > MAX_BYTES {
        spare.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_a_big_enough_buffer_and_ignores_small_ones() {
        let mut a = take(3 << 20);
        a.extend_from_slice(&[7; 100]);
        let ptr = a.as_ptr();
        give(a);
        // Other tests may use the pool at the same time: look for ours among a few takes.
        let mut found = false;
        let mut taken = Vec::new();
        for _ in 0..MAX_BUFFERS + 1 {
            let b = take(2 << 20);
            assert!(b.is_empty() && b.capacity() >= 2 << 20);
            found |= b.as_ptr() == ptr;
            taken.push(b);
        }
        assert!(found, "the spare buffer was not reused");
        give(vec![0; 10]);
        assert!(take(10).capacity() >= 10);
    }

    #[test]
    fn a_small_batch_leaves_a_large_buffer_for_a_large_one() {
        let big = vec![1u8; 40 << 20];
        let ptr = big.as_ptr();
        give(big);
        let small = take(4 << 20);
        assert_ne!(small.as_ptr(), ptr, "a buffer ten times too large is left");
        let filled = take_filled(40 << 20);
        assert_eq!((filled.as_ptr(), filled.len()), (ptr, 40 << 20), "reused, its bytes kept");
    }

    #[test]
    fn a_filled_buffer_has_exactly_the_length_asked() {
        let len = (5 << 20) + 3;
        give(vec![9; len + 100]);
        for _ in 0..MAX_BUFFERS + 1 {
            let b = take_filled(len);
            assert_eq!(b.len(), len);
            give(b);
        }
        assert_eq!(take_filled(10), vec![0; 10]);
    }
}
