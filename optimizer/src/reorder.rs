//! Reordering: filters, projections and size-reducing image stages move earlier across the
//! stages they commute with, each move justified by a rule that says why the output is the same.

use crate::Equivalence;
use crate::effects::{Effects, Fields, Role};

/// One swap: the stage at `moved` (an index into the stages as written) now runs before
/// `past`.
#[derive(Clone, Debug, PartialEq)]
pub struct Swap {
    /// The stage that moved earlier.
    pub moved: usize,
    /// The stage it moved before.
    pub past: usize,
    /// Why the output is the same.
    pub rule: &'static str,
    /// How the output compares.
    pub equivalence: Equivalence,
    /// What the move saves.
    pub gain: &'static str,
}

/// Whether `b`, which runs right after `a`, may run before it: the rule and equivalence when it
/// may.
pub fn commute(a: &Effects, b: &Effects) -> Option<(&'static str, Equivalence)> {
    if !a.movable || !b.movable {
        return None;
    }
    if a.random && b.random {
        // Both draw from the element's stream: swapped, each would get the other's numbers.
        return None;
    }
    if let Role::Select(keep) = &b.role {
        // Run first, the projection must keep what `a` reads and writes, and `a` must only
        // change fields it reads (so that they exist before it, where the select checks them).
        let only_changes_what_it_reads = match (&a.writes, &a.reads) {
            (Fields::Known(w), Fields::Known(r)) => w.is_subset(r),
            _ => false,
        };
        return (a.reads.within(keep) && a.writes.within(keep) && only_changes_what_it_reads).then_some((
            "the select keeps every field the stage reads and writes, and the stage adds none",
            Equivalence::Exact,
        ));
    }
    if let Role::Select(keep) = &a.role {
        return (b.reads.within(keep) && b.writes.within(keep))
            .then_some(("the stage reads and writes only fields the select keeps", Equivalence::Exact));
    }
    if matches!(b.role, Role::Pack(_)) || matches!(a.role, Role::Pack(_)) {
        return None;
    }
    if let Role::Normalize { field, identity, hwc } = &a.role {
        match &b.role {
            Role::Flip(f) if f == field && *hwc => {
                return Some((
                    "mirroring moves whole pixels and normalization maps each pixel on its own",
                    Equivalence::Exact,
                ));
            }
            Role::Shrink(f) if f == field && *identity => {
                return Some(("`uint8` HWC normalization leaves every pixel as it is", Equivalence::Exact));
            }
            _ => {}
        }
        if b.min_size_of.as_deref() == Some(field.as_str()) && *identity {
            return Some(("`uint8` HWC normalization leaves every pixel as it is", Equivalence::Exact));
        }
    }
    let independent = !a.writes.meets(&b.reads) && !b.writes.meets(&a.reads) && !a.writes.meets(&b.writes);
    independent.then_some(("neither stage reads or writes a field the other writes", Equivalence::Exact))
}

/// Whether moving `b` before `a` saves work, and what it saves.
pub fn gain(a: &Effects, b: &Effects) -> Option<&'static str> {
    match (&a.role, &b.role) {
        (Role::Filter, Role::Filter) => None,
        (_, Role::Filter) => Some("the elements the filter drops no longer go through the stage it passed"),
        (Role::Filter | Role::Select(_), Role::Select(_)) => None,
        // Elsewhere a dropped field costs nothing to carry, and the source already skips what
        // no stage uses (projection pushdown): moving the select would gain nothing, and could
        // split a run the worker fuses (`text.tokenize → text.truncate_pad`).
        (_, Role::Select(_)) if a.crosses => Some(
            "the Python stage it passed receives only the selected fields: fewer bytes cross to its process",
        ),
        (Role::Normalize { field, .. }, Role::Flip(f)) if f == field => Some(
            "the flip mirrors the image before it becomes the output tensor (a quarter of the bytes \
             for float32), in the same pass as the normalization",
        ),
        (Role::Normalize { field, .. }, Role::Shrink(f)) if f == field => {
            Some("normalization runs on the smaller image, and the decode can fuse with the resize or crop")
        }
        _ => None,
    }
}

/// Reorders `effects` (one per stage, as written): returns the new order (indices into the
/// stages as written) and the swaps made. A swap never crosses position `fence` (a cut pinned
/// by `spec.cache.at`), and the stage at `pinned` never moves.
pub fn reorder(effects: &[Effects], fence: Option<usize>, pinned: Option<usize>) -> (Vec<usize>, Vec<Swap>) {
    let mut order: Vec<usize> = (0..effects.len()).collect();
    let mut swaps = Vec::new();
    // Bubble passes: each swap moves a stage one place earlier and is never undone (the gain
    // relation is not symmetric), so at most n² swaps happen.
    let mut changed = true;
    let mut passes = 0;
    while changed && passes <= effects.len() {
        changed = false;
        passes += 1;
        for p in 1..order.len() {
            if fence == Some(p) {
                continue;
            }
            let (a, b) = (order[p - 1], order[p]);
            if pinned == Some(a) || pinned == Some(b) {
                continue;
            }
            let Some(gain) = gain(&effects[a], &effects[b]) else { continue };
            let Some((rule, equivalence)) = commute(&effects[a], &effects[b]) else { continue };
            order.swap(p - 1, p);
            swaps.push(Swap { moved: b, past: a, rule, equivalence, gain });
            changed = true;
        }
    }
    (order, swaps)
}
