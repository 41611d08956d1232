//! Image normalization: per-channel lookup tables and the one-pass layout conversions.
//!
//! Every output value is a table entry, so any two places that build the table from the same
//! `f32` mean and std produce the same bits. Where the CPU has the vector units for it, the
//! values are computed instead of looked up (see `normalize/affine.rs`), by a formula checked at
//! construction to give every table entry bit for bit. A whole batch of 8 MiB or more is
//! written around the caches ([`Stores`]): nothing reads it back before it is complete.

mod affine;
#[cfg(test)]
mod bench;

use affine::Affine;

/// Per-channel lookup tables (entry `x` of table `c` is the `float32` output for value `x` of
/// channel `c`), with the arithmetic form that reproduces them, when there is one. Built by
/// [`lut`].
#[derive(Clone)]
pub struct Lut {
    tables: [[f32; 256]; 3],
    /// `Some` when the arithmetic form gives every entry of `tables`, bit for bit.
    affine: Option<Affine>,
}

impl std::fmt::Debug for Lut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ends = self.tables.map(|t| [t[0], t[255]]);
        f.debug_struct("Lut").field("ends", &ends).field("affine", &self.affine.is_some()).finish()
    }
}

impl Lut {
    /// The arithmetic form, when it reproduces the tables and this CPU runs it fast.
    fn arithmetic(&self) -> Option<&Affine> {
        self.affine.as_ref().filter(|_| affine::available())
    }
}

/// How a kernel stores the values it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Through the caches: for values read again soon (one image, a small batch).
    Cached,
    /// Around the caches (non-temporal stores), where the CPU has them: for a batch far larger
    /// than the caches, read back only once it is whole. A store through the caches first reads
    /// the line it writes, and evicts what the decoder is using.
    Streaming,
}

/// Output sizes from which [`Stores::for_output`] streams: past what a core's caches keep.
const STREAMING_FROM: usize = 8 << 20;

impl Stores {
    /// How to store an output of `bytes`: streaming from 8 MiB on, else through the caches.
    pub fn for_output(bytes: usize) -> Stores {
        if bytes >= STREAMING_FROM { Stores::Streaming } else { Stores::Cached }
    }
}

/// Axis order of an image tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[height, width, channel]`: interleaved pixels.
    Hwc,
    /// `[channel, height, width]`: one plane per channel.
    Chw,
}

/// The tables of `(x / 255 − mean[c]) / std[c]` for every `uint8` value `x`, each entry
/// computed in `f64` and rounded once to `f32`, so that the output is the correctly rounded
/// value of the formula (a straightforward `f32` computation is within a few ulp of it).
pub fn lut(mean: [f32; 3], std: [f32; 3]) -> Lut {
    let mut tables = [[0.0f32; 256]; 3];
    for (c, table) in tables.iter_mut().enumerate() {
        let (m, s) = (f64::from(mean[c]), f64::from(std[c]));
        for (x, entry) in table.iter_mut().enumerate() {
            *entry = ((x as f64 / 255.0 - m) / s) as f32;
        }
    }
    let affine = Affine::new(mean, std);
    let affine = affine.reproduces(&tables).then_some(affine);
    Lut { tables, affine }
}

/// Appends the image `src` (`[h, w, 3]` interleaved RGB, rows of `w` pixels) to `out` as
/// `float32` through `lut`, in `layout`, mirrored left to right when `flip` is set.
pub fn normalize_into(src: &[u8], w: usize, lut: &Lut, layout: Layout, flip: bool, out: &mut Vec<f32>) {
    append(src, w, lut, layout, flip, Stores::Cached, out);
}

/// [`normalize_into`], storing the values as `stores` says.
fn append(src: &[u8], w: usize, lut: &Lut, layout: Layout, flip: bool, stores: Stores, out: &mut Vec<f32>) {
    if let Some(affine) = lut.arithmetic()
        && w > 0
    {
        let (pixels, _) = src.as_chunks::<3>();
        let pixels = &pixels[..pixels.len() / w * w];
        let values = pixels.len() * 3;
        out.reserve(values);
        let start = out.len();
        let spare = &mut out.spare_capacity_mut()[..values];
        affine.write(pixels, w, flip, layout, stores, spare);
        // SAFETY: `write` stored a value in each of the `values` slots after `start`, within
        // the capacity reserved above.
        unsafe { out.set_len(start + values) };
        return;
    }
    let [l0, l1, l2] = &lut.tables;
    match layout {
        Layout::Hwc => interleaved(
            src,
            w,
            flip,
            |p| [l0[usize::from(p[0])], l1[usize::from(p[1])], l2[usize::from(p[2])]],
            out,
        ),
        Layout::Chw => {
            planar(src, w, flip, |x| l0[usize::from(x)], |x| l1[usize::from(x)], |x| l2[usize::from(x)], out)
        }
    }
}

/// Appends the images of a batch to `out` as `float32` through `lut`, in `layout`: `pixels` holds
/// whole `[h, w, 3]` interleaved images one after another (a `uint8` `[rows, h, w, 3]` tensor),
/// and `out` gets the `[rows, h, w, 3]` or `[rows, 3, h, w]` values, each image as
/// [`normalize_into`] writes it without a flip. Bytes after the last whole image are left out.
/// A batch of 8 MiB or more of values is written around the caches ([`Stores::for_output`]).
pub fn normalize_batch_into(
    pixels: &[u8],
    h: usize,
    w: usize,
    lut: &Lut,
    layout: Layout,
    out: &mut Vec<f32>,
) {
    let image = h.saturating_mul(w).saturating_mul(3);
    if image == 0 {
        return;
    }
    let values = pixels.len() / image * image;
    out.reserve(values);
    let stores = Stores::for_output(values.saturating_mul(4));
    for one in pixels.chunks_exact(image) {
        append(one, w, lut, layout, false, stores, out);
    }
}

/// Writes the image `src` (`[h, w, 3]` interleaved RGB) over `out` (exactly
/// `src.len()` values) as `float32` through `lut`, in `layout`: the values [`normalize_into`]
/// appends without a flip, for a caller that owns the destination already (a batch's buffer),
/// stored as `stores` says (see [`Stores::for_output`]).
///
/// # Panics
/// When `out.len() != src.len()`.
pub fn normalize_over(src: &[u8], lut: &Lut, layout: Layout, stores: Stores, out: &mut [f32]) {
    assert_eq!(out.len(), src.len(), "normalize_over writes one value per byte of the image");
    let (pixels, rest) = src.as_chunks::<3>();
    if let Some(affine) = lut.arithmetic()
        && rest.is_empty()
        && !pixels.is_empty()
    {
        return affine.write(pixels, pixels.len(), false, layout, stores, out);
    }
    let [l0, l1, l2] = &lut.tables;
    match layout {
        Layout::Hwc => {
            let (values, _) = out.as_chunks_mut::<3>();
            for (v, p) in values.iter_mut().zip(pixels) {
                *v = [l0[usize::from(p[0])], l1[usize::from(p[1])], l2[usize::from(p[2])]];
            }
        }
        Layout::Chw => {
            for (c, (plane, table)) in out.chunks_exact_mut(pixels.len().max(1)).zip(&lut.tables).enumerate()
            {
                for (v, p) in plane.iter_mut().zip(pixels) {
                    *v = table[usize::from(p[c])];
                }
            }
        }
    }
}

/// Appends each pixel of `src` (`[h, w, 3]` interleaved) mapped through `f` to `out`, keeping
/// the HWC order and reversing each row when `flip` is set. Writes each output value once (no
/// zero-fill first).
pub fn interleaved<T: Copy>(
    src: &[u8],
    w: usize,
    flip: bool,
    f: impl Fn(&[u8; 3]) -> [T; 3],
    out: &mut Vec<T>,
) {
    if w == 0 {
        return;
    }
    out.reserve(src.len());
    for row in src.chunks_exact(w * 3) {
        let (pixels, _) = row.as_chunks::<3>();
        if flip {
            out.extend(pixels.iter().rev().flat_map(&f));
        } else {
            out.extend(pixels.iter().flat_map(&f));
        }
    }
}

/// Appends the interleaved pixels of `src` to `out` as three planes (`[h, w, 3]` → `[3, h, w]`),
/// mapping each channel's values through `fr`, `fg` and `fb` (generic, so that they inline) and
/// reversing each row when `flip` is set. One plane at a time, each output value written once.
/// (`uint8` planes without tables: [`crate::planes::planes_into`].)
pub(crate) fn planar<T: Copy>(
    src: &[u8],
    w: usize,
    flip: bool,
    fr: impl Fn(u8) -> T,
    fg: impl Fn(u8) -> T,
    fb: impl Fn(u8) -> T,
    out: &mut Vec<T>,
) {
    if w == 0 {
        return;
    }
    let (pixels, _) = src.as_chunks::<3>();
    out.reserve(pixels.len() * 3);
    plane(out, pixels, w, flip, 0, fr);
    plane(out, pixels, w, flip, 1, fg);
    plane(out, pixels, w, flip, 2, fb);
}

/// Appends channel `c` of `pixels` (rows of `w`) through `f` to `out`.
fn plane<T>(out: &mut Vec<T>, pixels: &[[u8; 3]], w: usize, flip: bool, c: usize, f: impl Fn(u8) -> T) {
    for row in pixels.chunks_exact(w) {
        if flip {
            out.extend(row.iter().rev().map(|p| f(p[c])));
        } else {
            out.extend(row.iter().map(|p| f(p[c])));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    const STD: [f32; 3] = [0.229, 0.224, 0.225];

    fn image(h: usize, w: usize) -> Vec<u8> {
        (0..h * w * 3).map(|i| (i * 37 % 256) as u8).collect()
    }

    fn exact(x: u8, c: usize) -> f32 {
        ((f64::from(x) / 255.0 - f64::from(MEAN[c])) / f64::from(STD[c])) as f32
    }

    #[test]
    fn every_layout_and_flip_matches_the_formula() {
        let (h, w) = (5, 7);
        let src = image(h, w);
        let table = lut(MEAN, STD);
        for layout in [Layout::Hwc, Layout::Chw] {
            for flip in [false, true] {
                let mut out = vec![-1.0];
                normalize_into(&src, w, &table, layout, flip, &mut out);
                assert_eq!(out.len(), 1 + h * w * 3, "appends after what is there");
                assert_eq!(out[0], -1.0);
                for y in 0..h {
                    for x in 0..w {
                        let sx = if flip { w - 1 - x } else { x };
                        for c in 0..3 {
                            let at = match layout {
                                Layout::Hwc => (y * w + x) * 3 + c,
                                Layout::Chw => c * h * w + y * w + x,
                            };
                            let value = src[(y * w + sx) * 3 + c];
                            assert_eq!(out[1 + at].to_bits(), exact(value, c).to_bits(), "{layout:?} {flip}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn writing_over_a_slice_gives_the_appended_values() {
        let (h, w) = (4, 9);
        let src = image(h, w);
        let table = lut(MEAN, STD);
        for layout in [Layout::Hwc, Layout::Chw] {
            let mut appended = Vec::new();
            normalize_into(&src, w, &table, layout, false, &mut appended);
            for stores in [Stores::Cached, Stores::Streaming] {
                let mut over = vec![f32::NAN; src.len()];
                normalize_over(&src, &table, layout, stores, &mut over);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&over), bits(&appended), "{layout:?} {stores:?}");
            }
        }
    }

    /// A `w`-pixel-wide image in which every channel takes every value 0..=255 (then some).
    fn every_value(h: usize, w: usize) -> Vec<u8> {
        (0..h * w * 3).map(|i| ((i / 3) * 7 + (i % 3) * 85) as u8).collect()
    }

    #[test]
    fn the_arithmetic_form_gives_the_tables_bits() {
        let imagenet = lut(MEAN, STD);
        assert!(imagenet.affine.is_some(), "the ImageNet tables have an exact arithmetic form");
        let (h, w) = (12, 37);
        let src = every_value(h, w);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let params =
            [(MEAN, STD), ([0.5; 3], [0.25; 3]), ([0.0; 3], [1.0; 3]), ([0.1, 0.9, 0.33], [0.07, 0.5, 0.91])];
        for (mean, std) in params {
            let table = lut(mean, std);
            let Some(affine) = table.affine else { continue };
            let tables_only = Lut { affine: None, ..table.clone() };
            for layout in [Layout::Hwc, Layout::Chw] {
                for flip in [false, true] {
                    let (mut fast, mut slow) = (vec![1.0], vec![1.0]);
                    normalize_into(&src, w, &table, layout, flip, &mut fast);
                    normalize_into(&src, w, &tables_only, layout, flip, &mut slow);
                    assert_eq!(bits(&fast), bits(&slow), "{mean:?} {std:?} {layout:?} flip {flip}");
                    // The kernel itself, whatever this CPU has.
                    let (pixels, _) = src.as_chunks::<3>();
                    for stores in [Stores::Cached, Stores::Streaming] {
                        let mut direct = vec![0.0; src.len()];
                        affine.write(pixels, w, flip, layout, stores, &mut direct);
                        assert_eq!(bits(&direct), bits(&slow[1..]), "{layout:?} flip {flip} {stores:?}");
                    }
                }
                for stores in [Stores::Cached, Stores::Streaming] {
                    let (mut fast, mut slow) = (vec![0.0; src.len()], vec![0.0; src.len()]);
                    normalize_over(&src, &table, layout, stores, &mut fast);
                    normalize_over(&src, &tables_only, layout, stores, &mut slow);
                    assert_eq!(bits(&fast), bits(&slow), "{layout:?} {stores:?}");
                }
            }
        }
    }

    #[test]
    fn the_arithmetic_form_gives_the_tables_bits_at_every_width_remainder() {
        let table = lut(MEAN, STD);
        let tables_only = Lut { affine: None, ..table.clone() };
        for w in 1..=9 {
            let src = every_value(40, w);
            for layout in [Layout::Hwc, Layout::Chw] {
                for flip in [false, true] {
                    let (mut fast, mut slow) = (Vec::new(), Vec::new());
                    normalize_into(&src, w, &table, layout, flip, &mut fast);
                    normalize_into(&src, w, &tables_only, layout, flip, &mut slow);
                    assert_eq!(fast, slow, "width {w} {layout:?} flip {flip}");
                }
            }
        }
    }

    /// Both forms in reading order at every pixel count around their eight-pixel steps, from
    /// every 4-byte offset of a 32-byte line (where streaming starts with single pixels, or the
    /// CHW form cannot stream because its planes are not 32 bytes apart), either way of storing.
    #[test]
    fn the_vector_forms_give_the_tables_bits_at_every_count_and_alignment() {
        let table = lut(MEAN, STD);
        let tables_only = Lut { affine: None, ..table.clone() };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let src = every_value(1, 300);
        for layout in [Layout::Chw, Layout::Hwc] {
            for n in (0..=41).chain([256, 299, 300]) {
                let image = &src[..n * 3];
                let mut expected = vec![0.0; n * 3];
                normalize_over(image, &tables_only, layout, Stores::Cached, &mut expected);
                for stores in [Stores::Cached, Stores::Streaming] {
                    for offset in 0..8 {
                        let mut buffer = vec![f32::NAN; n * 3 + 16];
                        let out = &mut buffer[offset..offset + n * 3];
                        normalize_over(image, &table, layout, stores, out);
                        assert_eq!(
                            bits(out),
                            bits(&expected),
                            "{layout:?}, {n} pixels at +{offset} {stores:?}"
                        );
                        let around =
                            buffer.iter().enumerate().filter(|&(i, _)| i < offset || i >= offset + n * 3);
                        assert!(
                            around.map(|(_, v)| v).all(|v| v.is_nan()),
                            "nothing written around the image"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn batches_from_8_mib_stream() {
        assert_eq!(Stores::for_output(128 * 224 * 224 * 3 * 4), Stores::Streaming);
        assert_eq!(Stores::for_output((8 << 20) - 1), Stores::Cached);
        assert_eq!(Stores::for_output(0), Stores::Cached);
    }

    #[test]
    fn a_form_that_misses_one_entry_is_not_used() {
        let mut table = lut(MEAN, STD);
        table.tables[1][200] = f32::from_bits(table.tables[1][200].to_bits() + 1);
        assert!(!Affine::new(MEAN, STD).reproduces(&table.tables));
        // Random parameters: wherever the form is kept, it is exact (checked by construction).
        let kept = (0..200)
            .filter(|i| {
                let f = |k: u32| ((i * 2654435761u32.wrapping_add(k) as usize) % 1000) as f32 / 1000.0;
                lut([f(1), f(2), f(3)], [0.05 + f(4), 0.05 + f(5), 0.05 + f(6)]).affine.is_some()
            })
            .count();
        assert!(kept > 150, "the form should fit nearly all parameters, fit {kept} of 200");
    }

    #[test]
    fn rows_that_do_not_fill_the_width_are_left_out_either_way() {
        let table = lut(MEAN, STD);
        let tables_only = Lut { affine: None, ..table.clone() };
        let src = every_value(3, 5);
        let cut = &src[..src.len() - 4];
        for layout in [Layout::Hwc, Layout::Chw] {
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            normalize_into(cut, 5, &table, layout, true, &mut fast);
            normalize_into(cut, 5, &tables_only, layout, true, &mut slow);
            assert_eq!(fast.len(), 2 * 5 * 3);
            assert_eq!(fast, slow);
        }
    }

    #[test]
    fn empty_images_append_nothing() {
        let mut out = Vec::new();
        normalize_into(&[], 0, &lut(MEAN, STD), Layout::Chw, true, &mut out);
        assert!(out.is_empty());
        normalize_batch_into(&[1, 2, 3], 0, 1, &lut(MEAN, STD), Layout::Hwc, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_batch_is_its_images_one_after_another() {
        let (rows, h, w) = (3, 2, 5);
        let batch = image(rows * h, w);
        let table = lut(MEAN, STD);
        for layout in [Layout::Hwc, Layout::Chw] {
            let mut one_by_one = Vec::new();
            for one in batch.chunks_exact(h * w * 3) {
                normalize_into(one, w, &table, layout, false, &mut one_by_one);
            }
            let mut whole = Vec::new();
            // A stray byte after the last image is left out.
            normalize_batch_into(&[&batch[..], &[7]].concat(), h, w, &table, layout, &mut whole);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&one_by_one), "{layout:?}");
        }
    }
}
