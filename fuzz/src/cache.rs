//! The cache's split manifests and chunk objects, as a reader parses them from the store.

use crate::input::Input;
use bytes::Bytes;
use granary_store::cache::fuzzing::{decode_chunk, encode_chunk, parse_split_manifest};
use granary_store::cache::{ChunkMeta, Fingerprint, HEADER_LEN};
use std::sync::OnceLock;

/// Records one round trip may encode.
const MAX_RECORDS: usize = 256;

fn fingerprint() -> &'static Fingerprint {
    static FP: OnceLock<Fingerprint> = OnceLock::new();
    FP.get_or_init(|| match Fingerprint::parse(&"ab".repeat(32)) {
        Ok(fp) => fp,
        Err(e) => panic!("the fuzz target's fingerprint is invalid: {e}"),
    })
}

/// The manifest entry a chunk object's own header describes: the checks against the manifest
/// pass, and those of the object itself are what is tested.
fn meta_of(object: &[u8]) -> ChunkMeta {
    let word = |at: usize| object.get(at..at + 4).map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    ChunkMeta {
        object: "object".into(),
        first: 0,
        elements: u64::from(word(8)),
        stored_bytes: object.len() as u64,
        raw_bytes: u64::from(word(12)),
        crc32: word(20),
    }
}

/// By the first byte's low two bits:
/// - 0: the rest is a split manifest (JSON) of split 7 of a fixed entry;
/// - 1: the rest is a chunk object, checked against the entry its header describes;
/// - 2: the same, with the header's crc32 first set to the payload's, so that decoding goes
///   past the checksum into decompression and record framing;
/// - 3: the rest is records (each u16-framed), encoded as a writer does: decoding must give
///   them back exactly.
pub fn cache(data: &[u8]) {
    let mut input = Input::new(data);
    match input.byte() & 3 {
        0 => {
            if let Ok(manifest) = parse_split_manifest(input.rest(), fingerprint(), 7) {
                assert_eq!(manifest.split, 7, "a manifest of another split was accepted");
            }
        }
        1 => {
            let object = input.rest();
            let _ = decode_chunk(Bytes::copy_from_slice(object), &meta_of(object));
        }
        2 => {
            let mut object = input.rest().to_vec();
            if object.len() >= HEADER_LEN {
                let crc = crc32fast::hash(&object[HEADER_LEN..]);
                object[20..24].copy_from_slice(&crc.to_le_bytes());
            }
            let meta = meta_of(&object);
            let _ = decode_chunk(Bytes::from(object), &meta);
        }
        _ => {
            let mut records = Vec::new();
            while !input.is_empty() && records.len() < MAX_RECORDS {
                records.push(input.framed());
            }
            let (object, meta) = match encode_chunk(&records) {
                Ok(encoded) => encoded,
                Err(e) => panic!("{} records did not encode: {e}", records.len()),
            };
            match decode_chunk(object, &meta) {
                Ok(decoded) => assert!(
                    decoded.len() == records.len() && decoded.iter().zip(&records).all(|(a, b)| a == b),
                    "a chunk did not decode to the records it was encoded from"
                ),
                Err(e) => panic!("a chunk just encoded does not decode: {e}"),
            }
        }
    }
}
