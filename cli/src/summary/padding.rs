//! The padding fraction of a pipeline with `spec.batch.pad`: the share of padding in the padded
//! fields, counted from the masks of delivered batches (their zeros over their cells), the same
//! way for the engine in this process and for batches read through workers.

use granary_crds::Manifest;

/// Pad cells and all cells of the masks seen so far.
#[derive(Clone, Debug)]
pub struct PaddingTally {
    /// The mask's field name.
    mask: String,
    padding: u64,
    cells: u64,
}

impl PaddingTally {
    /// A tally for `manifest`'s mask; `None` when it does not pad.
    pub fn of(manifest: &Manifest) -> Option<PaddingTally> {
        let pad = manifest.pipeline.spec.batch.pad.as_ref()?;
        Some(PaddingTally { mask: pad.mask_name(), padding: 0, cells: 0 })
    }

    /// Counts the mask among a batch's tensors, given as `(name, data)`.
    pub fn add<'a>(&mut self, tensors: impl IntoIterator<Item = (&'a str, &'a [u8])>) {
        if let Some((_, mask)) = tensors.into_iter().find(|(name, _)| *name == self.mask) {
            self.padding += mask.iter().filter(|&&m| m == 0).count() as u64;
            self.cells += mask.len() as u64;
        }
    }

    /// Pad cells over all cells, rounded to 4 decimals; `None` before any cell.
    pub fn fraction(&self) -> Option<f64> {
        (self.cells > 0).then(|| (self.padding as f64 / self.cells as f64 * 1e4).round() / 1e4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_zeros_of_the_mask_only() {
        let mut t = PaddingTally { mask: "m".into(), padding: 0, cells: 0 };
        assert_eq!(t.fraction(), None);
        t.add([("ids", &[0u8, 0, 0, 0][..]), ("m", &[1, 1, 0, 0][..])]);
        t.add([("m", &[1, 1, 1, 0][..])]);
        assert_eq!(t.fraction(), Some(0.375));
    }
}
