//! The plan layer between a pipeline's spec and its executor.
//!
//! [`optimize`] rewrites `spec.stages` into an equivalent plan and says why each rewrite keeps
//! the output, like a database's EXPLAIN:
//!
//! - **Reordering** ([`reorder`]): filters move earlier across stages they commute with (a
//!   filter passes a map that writes none of the fields it tests), a `table.select` moves before
//!   a Python stage that touches only the fields it keeps (fewer bytes cross to its process), and
//!   size-reducing or mirroring image stages move before an `image.normalize` they commute with
//!   (a flip before a HWC normalization; a crop or resize before a `uint8` HWC normalization,
//!   which leaves the pixels as they are). Two random stages never swap, since each draws from
//!   the element's one random stream; a Python stage moves, or lets others pass it, only when it
//!   declares the fields it reads and writes.
//! - **Projection pushdown** ([`projection`]): when a `table.select` or `text.pack` bounds the
//!   fields that reach the batch, the JSONL, Parquet and CSV readers read only the fields the
//!   stages use (`source.fields`).
//! - **Shuffle first** ([`Rewrite::ShuffleFirst`]): when every stage gives one element for each
//!   it takes (no filter, no packing, no skipped errors) and none hands elements to a Python
//!   process, the executor shuffles each split as it reads it instead of after the stages, with
//!   the same draws, so the batches are the same bytes.
//!
//! Fusion of image stages into one decode pass is the executor's (the worker's image path); the
//! plan it runs is this one, so reordering lets more pipelines take it.
//!
//! The rewrites depend only on the spec, so every process that runs a pipeline (the dispatcher,
//! each worker, `granary run`) derives the same plan, and cache fingerprints (computed on the
//! plan) agree. `spec.optimize: false` turns every rewrite off.

pub mod effects;
pub mod projection;
pub mod reorder;

use granary_crds::{CachePolicy, InputPipelineSpec, OpConfig, SourceFormat, SourceSpec, StageSpec};
use std::fmt::Write as _;

/// How the output of a rewritten plan compares with the stages as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Equivalence {
    /// The same elements with the same bytes.
    Exact,
    /// The same elements, values within the stated tolerance.
    Within(&'static str),
}

impl std::fmt::Display for Equivalence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Equivalence::Exact => f.write_str("exact"),
            Equivalence::Within(t) => write!(f, "within {t}"),
        }
    }
}

/// One rewrite of the plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Rewrite {
    /// A stage moved earlier, before the stages listed.
    Reorder {
        /// The stage that moved (its index in `spec.stages` as written).
        stage: usize,
        /// The stages it now runs before, in the order it passed them.
        past: Vec<usize>,
        /// Why the output is the same.
        rule: &'static str,
        /// How the output compares.
        equivalence: Equivalence,
        /// What the move saves, as modelled.
        gain: &'static str,
    },
    /// The source reads only these fields.
    Projection {
        /// The fields read.
        fields: Vec<String>,
    },
    /// Each split is shuffled as it is read, before the stages, rather than after them.
    ShuffleFirst,
}

/// Why shuffling before the stages gives the same batches: the rule [`Rewrite::ShuffleFirst`]
/// states.
pub const SHUFFLE_FIRST_RULE: &str = "the shuffle buffer's draws depend only on positions, every \
     stage gives one element for each it takes, and each element draws its augmentations from \
     the stream of its position in the split, whenever it is computed";

/// One stage of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedStage {
    /// Its index in `spec.stages` as written: what messages about it name.
    pub origin: usize,
    /// The stage.
    pub stage: StageSpec,
}

/// The plan of a pipeline: its stages in the order they run, the fields its source reads, and
/// the rewrites that made it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The stages, in the order they run.
    pub stages: Vec<PlannedStage>,
    /// The fields the source reads (`None`: all).
    pub fields: Option<Vec<String>>,
    /// The rewrites, in the order they were made.
    pub rewrites: Vec<Rewrite>,
    /// Whether the spec lets the optimizer rewrite (`spec.optimize`).
    pub enabled: bool,
}

/// The formats whose readers can skip fields.
fn projects(format: SourceFormat) -> bool {
    matches!(format, SourceFormat::Jsonl | SourceFormat::Parquet | SourceFormat::Csv)
}

/// The fields a source with `own` fields (`None`: all) reads when the plan needs `needed`.
fn narrowed(own: Option<&[String]>, needed: &[String]) -> Option<Vec<String>> {
    Some(match own {
        Some(own) => own.iter().filter(|f| needed.contains(f)).cloned().collect(),
        None => needed.to_vec(),
    })
}

/// The plan of `spec`: its stages rewritten into an equivalent, cheaper order, and the source
/// fields they use. With `spec.optimize: false`, the stages as written.
pub fn optimize(spec: &InputPipelineSpec) -> Plan {
    let as_written = |enabled| Plan {
        stages: spec
            .stages
            .iter()
            .enumerate()
            .map(|(origin, stage)| PlannedStage { origin, stage: stage.clone() })
            .collect(),
        fields: None,
        rewrites: Vec::new(),
        enabled,
    };
    if !spec.optimize {
        return as_written(false);
    }
    let configs: Vec<Option<OpConfig>> = spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| OpConfig::parse(s, &format!("spec.stages[{i}]")).ok())
        .collect();
    let effects: Vec<effects::Effects> = configs.iter().map(|c| effects::of(c.as_ref())).collect();
    // A cut pinned by `spec.cache.at` stays where it is, and so does the stage it names: the
    // same stages precede it, so its index means the same to every process.
    let named = spec
        .cache
        .as_ref()
        .filter(|c| c.policy == CachePolicy::At)
        .and_then(|c| c.at.as_deref())
        .and_then(|at| spec.stages.iter().position(|s| s.display_name() == at));
    let (order, swaps) = reorder::reorder(&effects, named.map(|i| i + 1), named);
    let mut plan = as_written(true);
    plan.stages = order.iter().map(|&i| PlannedStage { origin: i, stage: spec.stages[i].clone() }).collect();
    for swap in swaps {
        match plan.rewrites.last_mut() {
            Some(Rewrite::Reorder { stage, past, rule, equivalence, .. })
                if *stage == swap.moved && *rule == swap.rule && *equivalence == swap.equivalence =>
            {
                past.push(swap.past);
            }
            _ => plan.rewrites.push(Rewrite::Reorder {
                stage: swap.moved,
                past: vec![swap.past],
                rule: swap.rule,
                equivalence: swap.equivalence,
                gain: swap.gain,
            }),
        }
    }
    let sources: Vec<&SourceSpec> =
        spec.source.iter().chain(spec.sources.iter().map(|s| &s.source)).collect();
    if !sources.is_empty() && sources.iter().all(|s| projects(s.format)) {
        let ordered: Vec<&effects::Effects> = order.iter().map(|&i| &effects[i]).collect();
        if let Some(needed) = projection::needed(&ordered).filter(|n| !n.is_empty()) {
            let fields: Vec<String> = needed.into_iter().collect();
            // A spec that names its fields keeps them; the plan only narrows them.
            if sources.iter().any(|s| narrowed(s.fields.as_deref(), &fields) != s.fields) {
                plan.rewrites.push(Rewrite::Projection { fields: fields.clone() });
                plan.fields = Some(fields);
            }
        }
    }
    if spec.shuffle.is_some()
        && granary_crds::validate::spec_counts_known(spec)
        && !effects.iter().any(|e| e.crosses)
    {
        plan.rewrites.push(Rewrite::ShuffleFirst);
    }
    plan
}

impl Plan {
    /// Whether each split is shuffled as it is read, before the stages ([`Rewrite::ShuffleFirst`]):
    /// the stages then compute elements in the order they are batched, so a batch waits for its
    /// own elements only, and the shuffle buffer holds elements as read, not computed ones.
    pub fn shuffles_first(&self) -> bool {
        self.rewrites.contains(&Rewrite::ShuffleFirst)
    }

    /// `spec` with the plan's stages and source fields: what the executor and the cache run on.
    pub fn apply(&self, spec: &InputPipelineSpec) -> InputPipelineSpec {
        let mut out = spec.clone();
        out.stages = self.stages.iter().map(|s| s.stage.clone()).collect();
        if let Some(fields) = &self.fields {
            let narrow = |source: &mut SourceSpec| source.fields = narrowed(source.fields.as_deref(), fields);
            out.source.iter_mut().for_each(narrow);
            out.sources.iter_mut().for_each(|s| narrow(&mut s.source));
        }
        out
    }

    /// For each stage of the plan, its index in `spec.stages` as written.
    pub fn origins(&self) -> Vec<usize> {
        self.stages.iter().map(|s| s.origin).collect()
    }

    /// Whether the plan runs the stages as written, reading every field.
    pub fn is_as_written(&self) -> bool {
        self.rewrites.is_empty()
    }

    /// One line per stage in the order it runs, `spec.stages[i] name`.
    pub fn stage_lines(&self) -> Vec<String> {
        self.stages.iter().map(|s| format!("spec.stages[{}] {}", s.origin, s.stage.display_name())).collect()
    }

    /// The plan in effect as `status.plan` and the run summary show it: its stages in order, the
    /// fields the source reads and one line per rewrite; `None` when the stages run as written.
    pub fn in_effect(&self, spec: &InputPipelineSpec) -> Option<granary_crds::PlanStatus> {
        (!self.is_as_written()).then(|| granary_crds::PlanStatus {
            stages: self.stage_lines(),
            source_fields: self.fields.clone(),
            rewrites: self.rewrite_lines(spec),
        })
    }

    /// One line per rewrite: what moved before what, or which fields the source reads, with the
    /// rule that keeps the output.
    fn rewrite_lines(&self, spec: &InputPipelineSpec) -> Vec<String> {
        let name = |i: usize| {
            spec.stages.get(i).map_or_else(
                || format!("spec.stages[{i}]"),
                |s| format!("spec.stages[{i}] {}", s.display_name()),
            )
        };
        self.rewrites
            .iter()
            .map(|r| match r {
                Rewrite::Reorder { stage, past, rule, equivalence, .. } => {
                    let past: Vec<String> = past.iter().map(|&i| name(i)).collect();
                    format!("moved {} before {} ({equivalence}: {rule})", name(*stage), past.join(", "))
                }
                Rewrite::Projection { fields } => {
                    format!(
                        "the source reads only {} (exact: nothing after uses the others)",
                        fields.join(", ")
                    )
                }
                Rewrite::ShuffleFirst => {
                    format!("each split is shuffled as it is read, before the stages (exact: {SHUFFLE_FIRST_RULE})")
                }
            })
            .collect()
    }

    /// The plan as text: the stages in the order they run, the fields read, and each rewrite
    /// with its rule, equivalence and gain.
    pub fn explain(&self, spec: &InputPipelineSpec) -> String {
        let name = |i: usize| {
            spec.stages.get(i).map_or_else(
                || format!("spec.stages[{i}]"),
                |s| format!("spec.stages[{i}] `{}`", s.display_name()),
            )
        };
        let mut out = String::new();
        if !self.enabled {
            out.push_str("optimizer: off (spec.optimize: false); the stages run as written\n");
        }
        out.push_str("stages, in the order they run:\n");
        for line in self.stage_lines() {
            let _ = writeln!(out, "  {line}");
        }
        match &self.fields {
            Some(fields) => {
                let _ = writeln!(out, "source reads: {}", fields.join(", "));
            }
            None => out.push_str("source reads: every field\n"),
        }
        if self.rewrites.is_empty() && self.enabled {
            out.push_str("rewrites: none (the stages as written are the plan)\n");
        }
        for (n, rewrite) in self.rewrites.iter().enumerate() {
            match rewrite {
                Rewrite::Reorder { stage, past, rule, equivalence, gain } => {
                    let past: Vec<String> = past.iter().map(|&i| name(i)).collect();
                    let _ =
                        writeln!(out, "rewrite {}: moved {} before {}", n + 1, name(*stage), past.join(", "));
                    let _ = writeln!(out, "  equivalence: {equivalence} ({rule})");
                    let _ = writeln!(out, "  gain (modelled): {gain}");
                }
                Rewrite::Projection { fields } => {
                    let _ = writeln!(out, "rewrite {}: the source reads only {}", n + 1, fields.join(", "));
                    out.push_str("  equivalence: exact (no stage and no batch field uses the others)\n");
                    out.push_str("  gain (modelled): the other fields are neither read nor decoded\n");
                }
                Rewrite::ShuffleFirst => {
                    let _ = writeln!(
                        out,
                        "rewrite {}: each split is shuffled as it is read, before the stages",
                        n + 1
                    );
                    let _ = writeln!(out, "  equivalence: exact ({SHUFFLE_FIRST_RULE})");
                    out.push_str(
                        "  gain (modelled): elements are computed in the order they are batched, so a batch \
                         waits for its own elements only, and the shuffle buffer holds elements as read, not \
                         computed ones\n",
                    );
                }
            }
        }
        out
    }
}
