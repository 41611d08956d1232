//! A planned image: everything the fused image operators decide for one image (the window to
//! decode and the box to resize, where the box lands in the output, the flip), so that the
//! pixels follow from the JPEG's bytes alone, in whichever process executes the plan.

use crate::jpeg::with_decoder;
use crate::resize::resize_box;
use crate::window::WindowPlan;
use std::cell::RefCell;

/// One image's plan, complete: executing it needs only the JPEG it was made from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannedImage {
    /// What to decode, and the box of the decoded window to resize.
    pub window: WindowPlan,
    /// Rows the box is resized to.
    pub rows: usize,
    /// Columns the box is resized to.
    pub cols: usize,
    /// Rows of the output.
    pub height: usize,
    /// Columns of the output.
    pub width: usize,
    /// First output row of the resized box (zeros above it).
    pub top: usize,
    /// First output column of the resized box (zeros left of it).
    pub left: usize,
    /// Whether the output is mirrored left to right.
    pub flip: bool,
}

/// How far a plan's box may reach past its window's edge: the planners compute both from the
/// same floating-point values, and only rounding separates them.
const SLACK: f64 = 1e-6;

thread_local! {
    /// Per-thread buffers, reused across images: the decoded window and the resized box.
    static WINDOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RESIZED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl PlannedImage {
    /// Bytes of the output: RGB `uint8`, `height × width × 3`.
    pub fn output_len(&self) -> usize {
        self.height * self.width * 3
    }

    /// Executes the plan on `jpeg`, writing the RGB `uint8` HWC output into `out`, which must
    /// hold [`PlannedImage::output_len`] bytes. A plan that does not fit its own output or
    /// the JPEG (a plan from elsewhere, or made for other bytes) is an error, never a write out
    /// of bounds.
    pub fn execute(&self, jpeg: &[u8], out: &mut [u8]) -> Result<(), String> {
        let fits = self.height <= crate::MAX_SIDE
            && self.width <= crate::MAX_SIDE
            && self.rows > 0
            && self.cols > 0
            && self.top.checked_add(self.rows).is_some_and(|bottom| bottom <= self.height)
            && self.left.checked_add(self.cols).is_some_and(|right| right <= self.width);
        if !fits {
            return Err(format!(
                "the plan puts a {}×{} box at row {}, column {} of a {}×{} output",
                self.cols, self.rows, self.top, self.left, self.width, self.height
            ));
        }
        let [left, top, width, height] = self.window.crop;
        let (w, h) = (self.window.window.width as f64, self.window.window.height as f64);
        let inside = self.window.crop.iter().all(|v| v.is_finite())
            && left >= 0.0
            && top >= 0.0
            && width > 0.0
            && height > 0.0
            && left + width <= w + SLACK
            && top + height <= h + SLACK;
        if !inside {
            return Err(format!(
                "the plan's box {:?} is not inside its {}×{} window",
                self.window.crop, self.window.window.width, self.window.window.height
            ));
        }
        if out.len() != self.output_len() {
            return Err(format!(
                "the output holds {} bytes, not the plan's {}",
                out.len(),
                self.output_len()
            ));
        }
        let info = with_decoder(|decoder| decoder.header(jpeg))?;
        WINDOW.with(|window| {
            RESIZED.with(|resized| {
                let (mut window, mut resized) = (window.borrow_mut(), resized.borrow_mut());
                let image = self.window.decode(jpeg, &info, &mut window)?;
                resize_box(image, self.window.crop, self.window.edges, self.rows, self.cols, &mut resized)?;
                self.place(&resized[..self.rows * self.cols * 3], out);
                Ok(())
            })
        })
    }

    /// Writes the resized box into `out` at its place, zeros around it, mirrored when flipped.
    fn place(&self, resized: &[u8], out: &mut [u8]) {
        if (self.rows, self.cols) == (self.height, self.width) {
            out.copy_from_slice(resized);
        } else {
            pad_into(resized, self.cols, self.top, self.left, self.width, out);
        }
        if self.flip {
            granary_kernels::mirror::mirror_in_place(out, self.width);
        }
    }
}

/// Writes `resized` (rows of `cols` RGB pixels) into `out` (rows of `width` RGB pixels) from
/// row `top` and column `left`, with zeros everywhere else, as a centre crop pads an image
/// smaller than itself. The box must fit: `left + cols <= width`, and `out` must hold its rows.
pub fn pad_into(resized: &[u8], cols: usize, top: usize, left: usize, width: usize, out: &mut [u8]) {
    out.fill(0);
    let line = cols * 3;
    for (y, row) in resized.chunks_exact(line).enumerate() {
        let start = ((top + y) * width + left) * 3;
        out[start..start + line].copy_from_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CropBox;
    use crate::test_images::jpeg;

    fn planned(bytes: &[u8], region: CropBox, size: usize, flip: bool) -> PlannedImage {
        let info = with_decoder(|d| d.header(bytes)).unwrap();
        let window = WindowPlan::crop(&info, region, size);
        PlannedImage { window, rows: size, cols: size, height: size, width: size, top: 0, left: 0, flip }
    }

    #[test]
    fn a_plan_gives_the_resized_crop_mirrored_when_flipped() {
        let (bytes, _) = jpeg(90, 120);
        let region = CropBox { top: 5, left: 17, height: 70, width: 90 };
        let (expected, _) = crate::resized_crop(&bytes, region, 24).unwrap();
        let mut out = vec![0; 24 * 24 * 3];
        planned(&bytes, region, 24, false).execute(&bytes, &mut out).unwrap();
        assert_eq!(out, expected);
        planned(&bytes, region, 24, true).execute(&bytes, &mut out).unwrap();
        let mut mirrored = expected.clone();
        for row in mirrored.chunks_exact_mut(24 * 3) {
            let pixels: Vec<[u8; 3]> = row.chunks_exact(3).rev().map(|p| [p[0], p[1], p[2]]).collect();
            row.copy_from_slice(pixels.as_flattened());
        }
        assert_eq!(out, mirrored);
    }

    #[test]
    fn a_box_smaller_than_the_output_is_placed_with_zeros_around() {
        let (bytes, _) = jpeg(40, 40);
        let info = with_decoder(|d| d.header(&bytes)).unwrap();
        let window = WindowPlan::resize(&info, [0.0, 0.0, 40.0, 40.0], 20, 20, false);
        let plan =
            PlannedImage { window, rows: 20, cols: 20, height: 24, width: 30, top: 2, left: 5, flip: false };
        let mut out = vec![7; plan.output_len()];
        plan.execute(&bytes, &mut out).unwrap();
        let pixel = |y: usize, x: usize| &out[(y * 30 + x) * 3..][..3];
        assert_eq!(pixel(0, 0), [0, 0, 0]);
        assert_eq!(pixel(23, 29), [0, 0, 0]);
        assert_eq!(pixel(1, 10), [0, 0, 0]);
        assert_eq!(pixel(10, 4), [0, 0, 0]);
        assert_ne!(pixel(2, 5), [0, 0, 0], "the image starts at row 2, column 5");
    }

    #[test]
    fn plans_that_do_not_fit_are_errors_not_writes_out_of_bounds() {
        let (bytes, _) = jpeg(32, 32);
        let region = CropBox { top: 0, left: 0, height: 32, width: 32 };
        let good = planned(&bytes, region, 16, false);
        let mut out = vec![0; good.output_len()];
        for bad in [
            PlannedImage { top: 1, ..good },
            PlannedImage { left: usize::MAX, ..good },
            PlannedImage { rows: 0, ..good },
            PlannedImage { height: crate::MAX_SIDE + 1, ..good },
        ] {
            assert!(bad.execute(&bytes, &mut out).is_err(), "{bad:?}");
        }
        // Boxes that are not numbers, empty, or outside the window.
        for crop in [
            [f64::NAN, 0.0, 8.0, 8.0],
            [0.0, 0.0, f64::INFINITY, 8.0],
            [-1.0, 0.0, 8.0, 8.0],
            [0.0, 0.0, 0.0, 8.0],
            [30.0, 0.0, 8.0, 8.0],
            [0.0, 0.0, 8.0, 33.0],
        ] {
            let bad = PlannedImage { window: WindowPlan { crop, ..good.window }, ..good };
            assert!(bad.execute(&bytes, &mut out).is_err(), "{bad:?}");
        }
        assert!(good.execute(&bytes, &mut out[..10]).is_err());
        // A window past the image, or other bytes: the decoder refuses.
        let mut far = good;
        far.window.window.top = 1000;
        assert!(far.execute(&bytes, &mut out).is_err());
        assert!(good.execute(b"\xff\xd8\xffgarbage", &mut out).is_err());
        good.execute(&bytes, &mut out).unwrap();
    }
}
