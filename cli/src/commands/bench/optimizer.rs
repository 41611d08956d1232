//! `granary bench --compare-optimizer`: the pipeline with the optimizer on and off
//! (`spec.optimize: false`), in alternating rounds so that a change in the machine's load
//! weighs on both sides alike, and the median round of each.

use super::{Measurement, median};
use anyhow::Context;
use granary_crds::Manifest;
use granary_worker::{Engine, EngineOptions};

/// Rounds of each side.
pub const ROUNDS: usize = 3;

/// Measures `manifest` with the optimizer off, then on, [`ROUNDS`] times, each round on a
/// freshly opened engine; returns the median round with it on and with it off.
pub fn compare(
    manifest: &Manifest,
    options: &EngineOptions,
    measure: impl Fn(&Engine) -> anyhow::Result<Measurement>,
) -> anyhow::Result<(Measurement, Measurement)> {
    let mut off_manifest = manifest.clone();
    off_manifest.pipeline.spec.optimize = false;
    let mut on = Vec::with_capacity(ROUNDS);
    let mut off = Vec::with_capacity(ROUNDS);
    for round in 1..=ROUNDS {
        for (m, side, out) in [(&off_manifest, "off", &mut off), (manifest, "on", &mut on)] {
            let engine = Engine::open(m, options.clone())?;
            out.push(measure(&engine).with_context(|| format!("optimizer {side}, round {round}"))?);
        }
    }
    Ok((median(on), median(off)))
}
