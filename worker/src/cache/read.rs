//! Reading one split's entry: verify the manifest against the split, then each chunk, and hand
//! the elements over in order. A failure names the first element the entry could not supply;
//! the caller computes the split from there, so no element is delivered twice or lost.

use super::{EngineCache, EntrySplit, ReadReport, record};
use crate::element::Element;
use tokio::runtime::Handle;

/// Streams a split's elements from its entry split `entry` into `emit(index, element)` until it
/// returns false. Returns the index from which the source must supply the rest (`None`: nothing
/// left to supply) and what reading did.
pub fn read_split(
    cache: &EngineCache,
    entry: EntrySplit<'_>,
    elements: u64,
    rt: &Handle,
    emit: &mut dyn FnMut(u64, Element) -> bool,
) -> (Option<u64>, ReadReport) {
    let mut report = ReadReport::default();
    let store = &cache.store;
    let (fp, split) = (entry.fingerprint, entry.split);
    let fail = |report: &mut ReadReport, at: u64, bad: bool, problem: String| {
        tracing::warn!(split, fingerprint = %fp, at, "cache entry of split {split} unusable from element {at}: {problem}; computing from the source");
        report.bad |= bad;
        report.problem = Some(problem);
        Some(at)
    };
    let manifest = match rt.block_on(store.open_split(fp, split)) {
        Ok(m) => m,
        Err(e) => {
            let bad = e.is_corrupt();
            return (fail(&mut report, 0, bad, e.to_string()), report);
        }
    };
    // The store checked the chunks cover the manifest's count contiguously; the count must also
    // be the split's.
    if manifest.elements != elements {
        let problem =
            format!("the manifest holds {} elements but the split has {elements}", manifest.elements);
        return (fail(&mut report, 0, true, problem), report);
    }
    for (i, chunk) in manifest.chunks.iter().enumerate() {
        let records = match rt.block_on(store.read_chunk(fp, &manifest, i)) {
            Ok(r) => r,
            Err(e) => {
                let bad = e.is_corrupt();
                return (fail(&mut report, chunk.first, bad, e.to_string()), report);
            }
        };
        // Decode the whole chunk before handing any of it over, so that a bad record anywhere
        // in it leaves the chunk's elements to the source.
        let mut decoded = Vec::with_capacity(records.len());
        for r in &records {
            match record::decode(r) {
                Ok(e) => decoded.push(e),
                Err(e) => {
                    let problem = format!("chunk {} ({}): {e}", i, chunk.object);
                    return (fail(&mut report, chunk.first, true, problem), report);
                }
            }
        }
        report.bytes_read += chunk.stored_bytes;
        for (k, element) in decoded.into_iter().enumerate() {
            if !emit(chunk.first + k as u64, element) {
                return (None, report);
            }
        }
    }
    (None, report)
}
