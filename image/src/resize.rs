//! The resize of a planned box: bilinear, antialiased when shrinking (PIL's and torchvision's
//! `antialias=True` convolution), with `fast_image_resize`'s SIMD kernels.
//!
//! Like that crate, a box is resized in two passes, the vertical one first. Where the CPU has
//! AVX2 or AVX-512 with VBMI and VNNI, both passes are `granary_kernels::resize`'s: the same
//! taps and the same bytes, with two output pixels (AVX2) or four (AVX-512) to a vector in the
//! horizontal pass where the crate's AVX2 pass takes one.

use crate::{CropBox, RgbView};
use fast_image_resize as fr;
use granary_kernels::resize::{Horizontal, Vertical};
use std::cell::RefCell;

thread_local! {
    /// One resizer per thread, so that its scratch buffers are reused across images.
    static RESIZER: RefCell<fr::Resizer> = RefCell::new(fr::Resizer::new());
    /// The passes' taps and tables, and the vertical pass's output, which the horizontal reads.
    static PASSES: RefCell<(Vertical, Horizontal, Vec<u8>)> =
        RefCell::new((Vertical::default(), Horizontal::default(), Vec::new()));
}

/// Which pixels around the box the resize filter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edges {
    /// Only the box rounded out to whole pixels: a crop, then a resize of the crop.
    Box,
    /// The window's pixels around the box: part of a resize of the whole image.
    Image,
}

/// Keeps this thread's resizes to `kernels` or plainer (to compare kernels on one CPU).
#[cfg(test)]
fn limit_kernels(kernels: granary_kernels::resize::Kernels) {
    PASSES.with(|cell| {
        let (vertical, across, _) = &mut *cell.borrow_mut();
        vertical.limit(kernels);
        across.limit(kernels);
    });
}

/// Resizes the box `crop` (`[left, top, width, height]`, fractional) of `src` to
/// `rows × cols` into the start of `out` (which grows when it is too short; bytes after the
/// output are left as they were). `edges` says which pixels around the box the filter reads.
pub fn resize_box(
    src: RgbView<'_>,
    crop: [f64; 4],
    edges: Edges,
    rows: usize,
    cols: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let need = rows * cols * 3;
    // Every byte is written by the resizer: only grow, never clear.
    if out.len() < need {
        out.resize(need, 0);
    }
    Job::of_box(src, crop, edges, rows, cols).two_passes(&mut out[..need])
}

/// One resize: the box `crop` (`[left, top, width, height]`, fractional, within the view) of
/// the `view` of `src` (`[left, top, width, height]`, whole pixels: what the filter may read),
/// to `rows × cols` RGB.
#[derive(Clone, Copy, Debug)]
struct Job<'a> {
    src: RgbView<'a>,
    view: [usize; 4],
    crop: [f64; 4],
    rows: usize,
    cols: usize,
}

impl<'a> Job<'a> {
    /// The resize of the box `crop` of `src`, the filter reading what `edges` says.
    fn of_box(src: RgbView<'a>, crop: [f64; 4], edges: Edges, rows: usize, cols: usize) -> Job<'a> {
        let [left, top, width, height] = crop;
        let (view, crop) = match edges {
            Edges::Box => {
                // Whole pixels around the box: the filter is clamped to them.
                let (x0, y0) = (left.floor(), top.floor());
                let x1 = (left + width).ceil().min(src.width as f64);
                let y1 = (top + height).ceil().min(src.height as f64);
                let view = [x0 as usize, y0 as usize, (x1 - x0) as usize, (y1 - y0) as usize];
                (view, [left - x0, top - y0, width, height])
            }
            Edges::Image => {
                // Rounding must not push the box past the window's edge, which the resizer
                // refuses.
                let width = width.min(src.width as f64 - left);
                let height = height.min(src.height as f64 - top);
                ([0, 0, src.width, src.height], [left, top, width, height])
            }
        };
        Job { src, view, crop, rows, cols }
    }

    /// The resize into `out` (`rows × cols` RGB): by the kernels where they run, otherwise by
    /// `fast_image_resize`.
    fn two_passes(&self, out: &mut [u8]) -> Result<(), String> {
        let Job { src, view, crop, rows, cols } = *self;
        let [x, y, w, h] = view;
        let inside = src.data.len() >= src.width * src.height * 3
            && x.checked_add(w).is_some_and(|right| right <= src.width)
            && y.checked_add(h).is_some_and(|bottom| bottom <= src.height);
        if !inside {
            return Err(format!(
                "the {w}×{h} view at ({x}, {y}) is not inside the {}×{} image",
                src.width, src.height
            ));
        }
        let [cl, ct, cw, ch] = crop;
        // The crate skips the horizontal pass when the box's columns are the output's: so does
        // this, by leaving such boxes to it.
        let horizontal = cols as f64 != cw || cl != cl.round();
        PASSES.with(|cell| {
            let (vertical, across, between) = &mut *cell.borrow_mut();
            if horizontal {
                across.bilinear(w, cl, cl + cw, cols);
            }
            if !horizontal || !across.vectors() {
                return self.with_crate(out);
            }
            vertical.bilinear(h, ct, ct + ch, rows);
            // The vertical pass reads the columns the horizontal one needs, from its first row.
            let (first_col, span) = (across.taps().first(), across.taps().source_width());
            let first_row = vertical.taps().first();
            let len = span * 3;
            let need = rows * len;
            if between.len() < need {
                between.resize(need, 0);
            }
            let from = ((y + first_row) * src.width + x + first_col) * 3;
            vertical.run(&src.data[from..], src.width * 3, len, &mut between[..need]);
            across.run(&between[..need], out);
            Ok(())
        })
    }

    /// [`Job::two_passes`] by `fast_image_resize` alone.
    fn with_crate(&self, out: &mut [u8]) -> Result<(), String> {
        let Job { src, view, crop, rows, cols } = *self;
        let fail = |what: &dyn std::fmt::Display| {
            format!("resizing a {}×{} window failed: {what}", src.width, src.height)
        };
        // Within MAX_SIDE (checked by the planner and the decoder): fits in u32.
        let image =
            fr::images::ImageRef::new(src.width as u32, src.height as u32, src.data, fr::PixelType::U8x3)
                .map_err(|e| fail(&e))?;
        let mut dst = fr::images::Image::from_slice_u8(cols as u32, rows as u32, out, fr::PixelType::U8x3)
            .map_err(|e| fail(&e))?;
        let [x, y, w, h] = view.map(|v| v as u32);
        let around = fr::images::CroppedImage::new(&image, x, y, w, h).map_err(|e| fail(&e))?;
        let [left, top, width, height] = crop;
        let options = fr::ResizeOptions::new()
            .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
            .use_alpha(false)
            .crop(left, top, width, height);
        RESIZER.with(|r| r.borrow_mut().resize(&around, &mut dst, &options)).map_err(|e| fail(&e))
    }
}

/// Resizes the `region` of `src` (the whole image when `None`) to `out_height × out_width` into
/// a new buffer: bilinear, antialiased when shrinking, the filter reading only the region, as
/// if it had been cropped first. Sides must be within [`crate::MAX_SIDE`].
pub fn resize_region(
    src: RgbView<'_>,
    region: Option<CropBox>,
    out_height: usize,
    out_width: usize,
) -> Result<Vec<u8>, String> {
    let fail = |what: &dyn std::fmt::Display| {
        format!("resizing a {}×{} image failed: {what}", src.width, src.height)
    };
    let sides = [src.height, src.width, out_height, out_width];
    if sides.iter().any(|&side| side == 0 || side > crate::MAX_SIDE) {
        return Err(fail(&format_args!(
            "a side of the input or the {out_width}×{out_height} output is 0 or over {}",
            crate::MAX_SIDE
        )));
    }
    let region = region.unwrap_or(CropBox { top: 0, left: 0, height: src.height, width: src.width });
    let in_bounds = region.height > 0
        && region.width > 0
        && region.top.checked_add(region.height).is_some_and(|b| b <= src.height)
        && region.left.checked_add(region.width).is_some_and(|r| r <= src.width);
    if !in_bounds {
        return Err(fail(&format_args!("crop box {region:?} is outside the image")));
    }
    let mut out = vec![0; out_height * out_width * 3];
    Job {
        src,
        view: [region.left, region.top, region.width, region.height],
        crop: [0.0, 0.0, region.width as f64, region.height as f64],
        rows: out_height,
        cols: out_width,
    }
    .two_passes(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::pattern;

    /// `resize_box` against `fast_image_resize` doing both passes, on the same box.
    fn against_crate(
        kernels: granary_kernels::resize::Kernels,
        height: usize,
        width: usize,
        crop: [f64; 4],
        edges: Edges,
        rows: usize,
        cols: usize,
    ) {
        let data = pattern(height, width);
        let src = RgbView { height, width, data: &data };
        let mut got = Vec::new();
        resize_box(src, crop, edges, rows, cols, &mut got).unwrap();
        let mut expected = vec![0; rows * cols * 3];
        Job::of_box(src, crop, edges, rows, cols).with_crate(&mut expected).unwrap();
        assert_eq!(got, expected, "{kernels:?}: {width}×{height}, box {crop:?} ({edges:?}) → {cols}×{rows}");
    }

    #[test]
    fn a_box_resized_gives_the_crates_bytes_at_every_scale_and_edge_with_every_kernel() {
        use granary_kernels::resize::Kernels;
        for kernels in
            [Kernels::Avx512, Kernels::Avx2, Kernels::Bytes].into_iter().filter(|&k| k <= Kernels::best())
        {
            limit_kernels(kernels);
            boxes_against_the_crate(kernels);
        }
        limit_kernels(Kernels::best());
    }

    fn boxes_against_the_crate(kernels: granary_kernels::resize::Kernels) {
        for (height, width) in [(375, 500), (224, 224), (97, 131), (600, 1400)] {
            for [fl, ft, fw, fh] in [
                [0.0, 0.0, 1.0, 1.0],
                [0.1, 0.05, 0.6, 0.7],
                [0.33, 0.5, 0.25, 0.31],
                [0.01, 0.2, 0.97, 0.12],
            ] {
                let (w, h) = (width as f64, height as f64);
                let crop = [fl * w + 0.37, ft * h + 0.11, fw * w - 0.5, fh * h - 0.2];
                for edges in [Edges::Box, Edges::Image] {
                    for (rows, cols) in [(224, 224), (17, 40), (160, 256), (1, 3)] {
                        against_crate(kernels, height, width, crop, edges, rows, cols);
                    }
                }
            }
        }
        // Whole pixels of the output's size: the crate copies, or runs one pass.
        against_crate(kernels, 50, 60, [5.0, 7.0, 32.0, 32.0], Edges::Box, 32, 32);
        against_crate(kernels, 50, 60, [5.0, 7.5, 32.0, 30.0], Edges::Image, 32, 32);
        against_crate(kernels, 50, 60, [5.5, 7.0, 31.0, 32.0], Edges::Box, 32, 32);
    }

    #[test]
    fn a_region_resized_gives_the_crates_bytes_and_bad_regions_are_errors() {
        let (height, width) = (375, 500);
        let data = pattern(height, width);
        let src = RgbView { height, width, data: &data };
        for region in [None, Some(CropBox { top: 30, left: 41, height: 300, width: 333 })] {
            for (rows, cols) in [(256, 341), (224, 224), (480, 640)] {
                let got = resize_region(src, region, rows, cols).unwrap();
                let r = region.unwrap_or(CropBox { top: 0, left: 0, height, width });
                let mut expected = vec![0; rows * cols * 3];
                let view = [r.left, r.top, r.width, r.height];
                let crop = [0.0, 0.0, r.width as f64, r.height as f64];
                Job { src, view, crop, rows, cols }.with_crate(&mut expected).unwrap();
                assert_eq!(got, expected, "{region:?} → {cols}×{rows}");
            }
        }
        assert!(
            resize_region(src, Some(CropBox { top: 300, left: 0, height: 100, width: 10 }), 8, 8).is_err()
        );
        let short = RgbView { height, width, data: &data[..1000] };
        assert!(
            resize_region(short, None, 8, 8).is_err(),
            "pixels missing are an error, not a read past them"
        );
    }
}
