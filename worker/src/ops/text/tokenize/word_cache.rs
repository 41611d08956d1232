//! The word → ids cache of `text.tokenize`'s fast path, shared by the compute threads.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// FxHash over the word's bytes: words are short and the map is private.
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

const SHARDS: usize = 16;
/// Words kept per shard; later new words are encoded each time.
const SHARD_WORDS: usize = 1 << 13;

type Shard = HashMap<Box<[u8]>, Box<[u32]>, BuildHasherDefault<WordHasher>>;

/// Word → ids, shared by the compute threads, in shards so that they seldom wait on each other.
#[derive(Default)]
pub(super) struct WordCache {
    shards: [Mutex<Shard>; SHARDS],
}

impl WordCache {
    fn shard(&self, word: &[u8]) -> &Mutex<Shard> {
        let mut h = WordHasher::default();
        h.write(word);
        &self.shards[(h.finish() >> 32) as usize % SHARDS]
    }

    /// Appends the cached ids of `word`; false when it is not cached.
    pub(super) fn extend(&self, word: &[u8], ids: &mut Vec<u32>) -> bool {
        let Ok(shard) = self.shard(word).lock() else { return false };
        match shard.get(word) {
            Some(cached) => {
                ids.extend_from_slice(cached);
                true
            }
            None => false,
        }
    }

    pub(super) fn insert(&self, word: &[u8], ids: &[u32]) {
        if let Ok(mut shard) = self.shard(word).lock()
            && shard.len() < SHARD_WORDS
        {
            shard.insert(word.into(), ids.into());
        }
    }
}
