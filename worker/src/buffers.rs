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
/// Most buffers kept.
const MAX_BUFFERS: usize = 4;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer with room for at least `capacity` bytes, recycled when one is spare.
pub fn take(capacity: usize) -> Vec<u8> {
    if capacity >= MIN_BYTES
        && let Ok(mut spare) = SPARE.lock()
    {
        // The smallest spare buffer that fits.
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut buffer = spare.swap_remove(i);
            buffer.clear();
            return buffer;
        }
    }
    Vec::with_capacity(capacity)
}

/// Hands a buffer back for reuse; the smallest one is dropped when the pool is full.
pub fn give(buffer: Vec<u8>) {
    if buffer.capacity() < MIN_BYTES {
        return;
    }
    let Ok(mut spare) = SPARE.lock() else { return };
    spare.push(buffer);
    if spare.len() > MAX_BUFFERS
        && let Some((i, _)) = spare.iter().enumerate().min_by_key(|(_, b)| b.capacity())
    {
        spare.swap_remove(i);
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
}
