//! Groups for batched stages: when a stage takes several elements at once (`python.map` with
//! `batched: true`), the reader hands a compute thread the consecutive elements of a split whose
//! indices fall in one block of `batch.size` (elements `[k·B, (k+1)·B)`), and the thread runs
//! every stage over the group: element-wise stages one element at a time, batched stages on all
//! members that reached them. An element-wise stage that gathers its calls (an element-wise
//! `python.map`) takes all members that reached it in one call too, each with its own stream,
//! so its output is that of one call per element; without a batched stage, its groups are
//! blocks of [`super::GATHER`]. Blocks are fixed by index, so a recomputed split, or one read
//! partly from the cache, forms the same groups, and the batched stage's random stream belongs
//! to the block: output does not depend on threads or timing.
//!
//! Filters: a member that a filter drops (element-wise, or a batched filter's decision) leaves
//! the group there, and the stages after do not run on it. A later batched stage takes the
//! members that are left, as they are: groups are not refilled from the next block, so such a
//! stage may see fewer than `batch.size` elements (and is not called for a block that lost them
//! all). Its random stream still belongs to the block, and which members are left depends only
//! on the elements and their own streams, so the output stays independent of threads and timing.

use super::{ExecError, ImageForm, Member, Plan, Ran, StageTimes, Task, panicked, record};
use crate::contained::contained;
use crate::ops::Fate;
use crate::seed::{SeededRng, Stream};
use std::time::Instant;

/// One member's progress through the stages.
struct Progress {
    rng: SeededRng,
    /// Index of the next stage to apply.
    at: usize,
    /// Index of the stage boundary whose elements the task writes to the cache, if any.
    cut: Option<usize>,
    record: Option<Vec<u8>>,
    /// Still in the group: no filter has dropped it.
    kept: bool,
    /// The error of an element-wise stage that failed on it, when it is skipped
    /// (`spec.errors.policy: skip`): it leaves the group as a dropped member does.
    skipped: Option<String>,
}

/// Runs every stage over `members` (consecutive elements of one split, each from its own start
/// stage); returns, per member, whether it was kept and its cache record when the task writes
/// one.
pub(super) fn run(
    plan: &Plan,
    task: Task,
    split_id: u64,
    members: &mut [Member],
    times: &StageTimes,
) -> Result<Vec<Ran>, ExecError> {
    let n = plan.element_stages();
    let mut progress: Vec<Progress> = members
        .iter()
        .map(|m| Progress {
            rng: SeededRng::for_element(plan.seed, u64::from(task.epoch), split_id, m.index),
            at: m.start.min(n),
            cut: super::write_cut(plan, task, m.start),
            record: None,
            kept: true,
            skipped: None,
        })
        .collect();
    let grouped: Vec<usize> =
        (0..n).filter(|&i| plan.stages[i].op.batched() || plan.stages[i].op.gathers()).collect();
    for &b in &grouped {
        for (member, p) in members.iter_mut().zip(&mut progress) {
            if p.kept && p.at <= b {
                advance_or_skip(plan, member, p, b, times)?;
            }
        }
        let takers: Vec<usize> =
            (0..members.len()).filter(|&i| progress[i].kept && progress[i].at == b).collect();
        let Some(&first) = takers.first() else { continue };
        let stage = &plan.stages[b];
        if !stage.op.batched() {
            gather(plan, b, &takers, members, &mut progress, times)?;
            continue;
        }
        let mut elements: Vec<_> = takers
            .iter()
            .map(|&i| std::mem::replace(&mut members[i].element, crate::Element::new("")))
            .collect();
        let block = members[first].index / plan.batch_size.max(1) as u64;
        let mut rng =
            SeededRng::new(plan.seed, Stream::Group, &[u64::from(task.epoch), split_id, block, b as u64]);
        let started = Instant::now();
        let result = contained(|| stage.op.run_group(&mut elements, &mut rng))
            .unwrap_or_else(|why| Err(panicked(why)));
        times.add(b, started.elapsed().as_nanos() as u64);
        let (key, count) = (elements.first().map(|e| e.key.clone()).unwrap_or_default(), elements.len());
        for (&i, element) in takers.iter().zip(elements) {
            members[i].element = element;
            progress[i].at = b + 1;
        }
        let op_error = |message: String| ExecError::Op {
            path: stage.path.clone(),
            stage: stage.name.clone(),
            key: key.clone(),
            message: match count {
                1 => message,
                _ => format!("(a batched call on {count} elements, from this one on) {message}"),
            },
        };
        let kept = result.map_err(|e| op_error(e.0))?;
        if let Some(kept) = kept {
            if kept.len() != takers.len() {
                return Err(op_error(format!("decided on {} elements of {}", kept.len(), takers.len())));
            }
            for (&i, keep) in takers.iter().zip(kept) {
                progress[i].kept &= keep;
            }
        }
    }
    for (member, p) in members.iter_mut().zip(&mut progress) {
        if p.kept {
            advance_or_skip(plan, member, p, n, times)?;
        }
        times.add_element();
    }
    Ok(progress
        .into_iter()
        .map(|p| Ran {
            fate: if p.kept { Fate::Keep } else { Fate::Drop },
            record: p.record,
            skipped: p.skipped,
        })
        .collect())
}

/// Runs element-wise stage `b`, which gathers its calls, on the members `takers` in one call,
/// each with its own stream; a member it drops leaves the group.
fn gather(
    plan: &Plan,
    b: usize,
    takers: &[usize],
    members: &mut [Member],
    progress: &mut [Progress],
    times: &StageTimes,
) -> Result<(), ExecError> {
    let stage = &plan.stages[b];
    let mut elements: Vec<_> =
        takers.iter().map(|&i| std::mem::replace(&mut members[i].element, crate::Element::new(""))).collect();
    let mut rngs: Vec<&mut SeededRng> = progress
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| takers.binary_search(i).is_ok())
        .map(|(_, p)| &mut p.rng)
        .collect();
    let started = Instant::now();
    // A panic is blamed on the call's first element: which one it was is not known.
    let result = contained(|| stage.op.run_each(&mut elements, &mut rngs))
        .unwrap_or_else(|why| Err((0, panicked(why))));
    times.add(b, started.elapsed().as_nanos() as u64);
    let keys: Vec<String> = match &result {
        Err((at, _)) => elements.get(*at).map(|e| e.key.clone()).into_iter().collect(),
        Ok(_) => Vec::new(),
    };
    for (&i, element) in takers.iter().zip(elements) {
        members[i].element = element;
        progress[i].at = b + 1;
    }
    let fates = result.map_err(|(_, e)| ExecError::Op {
        path: stage.path.clone(),
        stage: stage.name.clone(),
        key: keys.into_iter().next().unwrap_or_default(),
        message: e.0,
    })?;
    if fates.len() != takers.len() {
        return Err(ExecError::Internal(format!(
            "stage {} decided on {} elements of {}",
            stage.path,
            fates.len(),
            takers.len()
        )));
    }
    for (&i, fate) in takers.iter().zip(fates) {
        progress[i].kept &= fate == Fate::Keep;
    }
    Ok(())
}

/// [`advance`]; under `spec.errors.policy: skip`, a stage failing on the member takes it out of
/// the group, skipped, instead of failing the group.
fn advance_or_skip(
    plan: &Plan,
    member: &mut Member,
    p: &mut Progress,
    to: usize,
    times: &StageTimes,
) -> Result<(), ExecError> {
    match advance(plan, member, p, to, times) {
        Err(error @ ExecError::Op { .. }) if plan.skip_errors => {
            p.kept = false;
            p.skipped = Some(error.to_string());
            Ok(())
        }
        result => result,
    }
}

/// Applies the element-wise stages from `p.at` up to `to`, taking the cache record on the way;
/// a filter that drops the member takes it out of the group.
fn advance(
    plan: &Plan,
    member: &mut Member,
    p: &mut Progress,
    to: usize,
    times: &StageTimes,
) -> Result<(), ExecError> {
    if let Some(cut) = p.cut.filter(|c| (p.at..=to).contains(c) && p.record.is_none()) {
        if super::apply(plan, p.at..cut, &mut member.element, &mut p.rng, times, ImageForm::Made)?
            == Fate::Drop
        {
            p.kept = false;
            return Ok(());
        }
        p.record = Some(record::to_bytes(&member.element));
        p.at = cut;
    }
    if super::apply(plan, p.at..to, &mut member.element, &mut p.rng, times, ImageForm::Made)? == Fate::Drop {
        p.kept = false;
        return Ok(());
    }
    p.at = to;
    Ok(())
}
