//! The reader's cache path: a task that reads the cache streams its split's elements from the
//! entry, and from the source after the first bad or unreadable chunk.

use super::{CacheUse, Plan, Task};
use crate::cache::{ReadReport, read};
use crate::element::Element;
use tokio::runtime::Handle;

/// Streams what the entry holds for `task` into `send(index, start stage, element)`. Returns the
/// index from which the source must supply the elements (`None`: the entry supplied all of them,
/// or `send` stopped) and what reading did.
pub(super) fn read(
    plan: &Plan,
    task: Task,
    split_id: u64,
    rt: &Handle,
    send: &mut dyn FnMut(u64, usize, Element) -> bool,
) -> (Option<u64>, ReadReport) {
    let CacheUse::Read { cut, elements } = task.cache else {
        return (Some(0), ReadReport::default());
    };
    let (Some(cache), Some(start)) = (plan.cache.as_deref(), plan.stage_at_cut(cut)) else {
        return (Some(0), ReadReport::default());
    };
    // A virtual split id (a further pass of an upsampled source) reads its base split's entry:
    // see `EngineCache::locate`.
    let Some(entry) = cache.cut(cut).and_then(|c| cache.entry(c, split_id)) else {
        let report = ReadReport {
            problem: Some(format!(
                "this worker has no cache entry for split {split_id} at cut {cut}; computed"
            )),
            ..ReadReport::default()
        };
        return (Some(0), report);
    };
    read::read_split(cache, entry, elements, rt, &mut |index, element| send(index, start, element))
}
