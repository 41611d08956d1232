//! Projection pushdown: the source fields the plan uses, so that readers skip the others.

use crate::effects::{Effects, Fields, Role};
use std::collections::BTreeSet;

/// The fields of the source that the stages (run in this order) and the batch use: `None` when
/// that may be every field (the batch keeps every field unless a `table.select` or `text.pack`
/// says otherwise, and a stage with undeclared effects may read any field).
pub fn needed(effects: &[&Effects]) -> Option<BTreeSet<String>> {
    // Walk back from the batch, which takes every field that reaches it.
    let mut needed = Fields::Any;
    for e in effects.iter().rev() {
        needed = match &e.role {
            Role::Select(keep) => Fields::Known(keep.clone()),
            Role::Pack(field) => Fields::of([field.as_str()]),
            _ => match (needed, &e.reads, &e.writes) {
                (Fields::Known(mut set), Fields::Known(reads), Fields::Known(writes)) => {
                    // What the stage writes need not come from the source, unless it reads it.
                    set.retain(|f| !writes.contains(f));
                    set.extend(reads.iter().cloned());
                    Fields::Known(set)
                }
                _ => Fields::Any,
            },
        };
    }
    needed.known().cloned()
}
