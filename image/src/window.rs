//! Plans: what to decode of one JPEG and which box of it to resize, made from the header alone.
//!
//! - [`WindowPlan::crop`]: a random resized crop. The box is the crop, and the filter stays
//!   inside it rounded out to whole pixels, as if the image had been cropped first.
//! - [`WindowPlan::resize`]: a resize (then a centre crop). The box is the part of the image
//!   that lands in the output, and the filter reads the pixels around it, as a resize of the
//!   whole image would.
//!
//! Both decode at the smallest DCT scale that keeps the box at least as large as the output
//! ([`choose_scale`]), so that the resize never enlarges what the IDCT shrank.

use crate::jpeg::{JpegInfo, Window, with_decoder};
use crate::resize::{Edges, resize_box};
use crate::{CropBox, RgbView};

/// DCT scales (`n/8`) that libjpeg-turbo has SIMD inverse DCTs for; the others (3/8, 5/8,
/// 6/8, 7/8) run in plain C and cost more than decoding at the next SIMD scale and resizing.
/// Measured on the peers' 2,000 JPEGs (2 cores, three alternating rounds of `granary bench`):
/// with every scale allowed, the training recipe fell from 1,972–2,043 to 1,717–1,778
/// items/s and the validation recipe, whose crops mostly fall between 5/8 and 8/8, from
/// 1,748–1,804 to 1,359–1,509.
const SIMD_SCALES: [usize; 4] = [1, 2, 4, 8];

/// The smallest DCT scale `n/8` whose decode of a `crop_h × crop_w` box is still at least
/// `out_h × out_w`, so that resizing never enlarges what the IDCT shrank; `8` (no scaling) when
/// the crop is smaller than the output.
pub fn choose_scale(crop_h: usize, crop_w: usize, out_h: usize, out_w: usize) -> usize {
    SIMD_SCALES.into_iter().find(|&n| crop_h * n >= out_h * 8 && crop_w * n >= out_w * 8).unwrap_or(8)
}

/// What to decode for one image: the scale, the window of the scaled image, and the box within
/// the window as `[left, top, width, height]` in scaled pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowPlan {
    /// DCT scale numerator (over 8).
    pub num: usize,
    /// Scaled-image window to decode: the box (and, for [`Edges::Image`], the reach of the
    /// resize filter around it) rounded out to whole pixels, the left edge moved down to an
    /// iMCU boundary.
    pub window: Window,
    /// The box within the window.
    pub crop: [f64; 4],
    /// Which pixels around the box the resize reads.
    pub edges: Edges,
}

/// Source pixels (in scaled pixels) the bilinear filter reaches beyond a box of `extent`
/// resized to `count` pixels, rounded up, with one to spare; none when the box is copied.
fn reach(extent: f64, count: usize, unscaled: bool) -> usize {
    if unscaled || count == 0 {
        return 0;
    }
    // The bilinear filter's support is 1, widened by the scale when shrinking.
    (extent / count as f64).max(1.0).ceil() as usize + 1
}

impl WindowPlan {
    /// Plans the decode of `region` (full-size pixels) of the image `info` for a `size × size`
    /// random resized crop.
    pub fn crop(info: &JpegInfo, region: CropBox, size: usize) -> WindowPlan {
        let num = choose_scale(region.height, region.width, size, size);
        let s = num as f64 / 8.0;
        let (sw, sh) = (JpegInfo::scaled(info.width, num), JpegInfo::scaled(info.height, num));
        let (fx0, fx1) = (region.left as f64 * s, (region.left + region.width) as f64 * s);
        let (fy0, fy1) = (region.top as f64 * s, (region.top + region.height) as f64 * s);
        let mcu = info.scaled_mcu_width(num).max(1);
        let x0 = (fx0.floor() as usize).min(sw.saturating_sub(1));
        let left = x0 - x0 % mcu;
        let right = (fx1.ceil() as usize).clamp(x0 + 1, sw);
        let top = (fy0.floor() as usize).min(sh.saturating_sub(1));
        let bottom = (fy1.ceil() as usize).clamp(top + 1, sh);
        let window = Window { left, top, width: right - left, height: bottom - top };
        let crop = [fx0 - left as f64, fy0 - top as f64, fx1 - fx0, fy1 - fy0];
        WindowPlan { num, window, crop, edges: Edges::Box }
    }

    /// Plans the decode of the box `source` (`[left, top, width, height]` in full-size pixels,
    /// fractional) of the image `info`, resized to `rows × cols` as part of a resize of the
    /// whole image; `unscaled` when that resize keeps the size (the box is whole pixels and is
    /// copied).
    pub fn resize(info: &JpegInfo, source: [f64; 4], rows: usize, cols: usize, unscaled: bool) -> WindowPlan {
        let [x, y, bw, bh] = source;
        let num = if unscaled {
            8
        } else {
            // Floored, so that the scaled box is never smaller than the output.
            choose_scale(bh.floor() as usize, bw.floor() as usize, rows, cols)
        };
        let s = num as f64 / 8.0;
        let (sw, sh) = (JpegInfo::scaled(info.width, num), JpegInfo::scaled(info.height, num));
        let (fx0, fx1) = (x * s, ((x + bw) * s).min(sw as f64));
        let (fy0, fy1) = (y * s, ((y + bh) * s).min(sh as f64));
        let (rx, ry) = (reach(fx1 - fx0, cols, unscaled), reach(fy1 - fy0, rows, unscaled));
        let mcu = info.scaled_mcu_width(num).max(1);
        let x0 = (fx0.floor() as usize).saturating_sub(rx).min(sw.saturating_sub(1));
        let left = x0 - x0 % mcu;
        let right = (fx1.ceil() as usize).saturating_add(rx).clamp(left + 1, sw.max(left + 1));
        let top = (fy0.floor() as usize).saturating_sub(ry).min(sh.saturating_sub(1));
        let bottom = (fy1.ceil() as usize).saturating_add(ry).clamp(top + 1, sh.max(top + 1));
        let window = Window { left, top, width: right - left, height: bottom - top };
        let crop = [fx0 - left as f64, fy0 - top as f64, fx1 - fx0, fy1 - fy0];
        WindowPlan { num, window, crop, edges: Edges::Image }
    }

    /// Decodes this plan's window of `jpeg` (whose header is `info`) into `buffer` and returns
    /// it as an image.
    pub fn decode<'a>(
        &self,
        jpeg: &[u8],
        info: &JpegInfo,
        buffer: &'a mut Vec<u8>,
    ) -> Result<RgbView<'a>, String> {
        with_decoder(|decoder| decoder.decode_window(jpeg, info, self.num, self.window, buffer))?;
        let (h, w) = (self.window.height, self.window.width);
        Ok(RgbView { height: h, width: w, data: &buffer[..h * w * 3] })
    }
}

/// The fast path's crop of one JPEG: the box `region` (full-size pixels) resized to
/// `size × size`, RGB `uint8` HWC, with the DCT scale numerator it decoded at. For tests and
/// tools that compare the fast path with a reference on given crop boxes.
pub fn resized_crop(jpeg: &[u8], region: CropBox, size: usize) -> Result<(Vec<u8>, usize), String> {
    let info = with_decoder(|decoder| decoder.header(jpeg))?;
    if !info.windowable {
        return Err("libjpeg-turbo cannot decode a window of this JPEG".to_string());
    }
    let plan = WindowPlan::crop(&info, region, size);
    let mut buffer = Vec::new();
    let window = plan.decode(jpeg, &info, &mut buffer)?;
    let mut out = Vec::new();
    resize_box(window, plan.crop, plan.edges, size, size, &mut out)?;
    Ok((out, plan.num))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::jpeg;

    #[test]
    fn scale_is_the_smallest_simd_scale_that_keeps_the_output_size() {
        assert_eq!(choose_scale(100, 100, 224, 224), 8); // enlarged: full size
        assert_eq!(choose_scale(447, 500, 224, 224), 8);
        assert_eq!(choose_scale(448, 448, 224, 224), 4);
        assert_eq!(choose_scale(900, 1000, 224, 224), 2);
        assert_eq!(choose_scale(2000, 1792, 224, 224), 1);
        assert_eq!(choose_scale(1000, 300, 224, 224), 8); // the narrow side decides
    }

    #[test]
    fn a_crop_window_covers_the_crop_and_starts_on_an_imcu() {
        let info = JpegInfo { width: 500, height: 375, mcu_width: 16, windowable: true };
        for region in [
            CropBox { top: 0, left: 0, height: 375, width: 500 },
            CropBox { top: 13, left: 37, height: 300, width: 451 },
            CropBox { top: 200, left: 499, height: 1, width: 1 },
            CropBox { top: 7, left: 3, height: 50, width: 60 },
        ] {
            let plan = WindowPlan::crop(&info, region, 224);
            let s = plan.num as f64 / 8.0;
            let w = plan.window;
            assert_eq!(w.left % info.scaled_mcu_width(plan.num), 0, "{region:?}");
            assert!(w.left + w.width <= JpegInfo::scaled(500, plan.num));
            assert!(w.top + w.height <= JpegInfo::scaled(375, plan.num));
            let [cl, ct, cw, ch] = plan.crop;
            // The crop box, in window pixels, is the region scaled, and inside the window.
            assert!((w.left as f64 + cl - region.left as f64 * s).abs() < 1e-9);
            assert!((w.top as f64 + ct - region.top as f64 * s).abs() < 1e-9);
            assert!(
                (cw - region.width as f64 * s).abs() < 1e-9 && (ch - region.height as f64 * s).abs() < 1e-9
            );
            assert!(
                cl >= 0.0
                    && ct >= 0.0
                    && cl + cw <= w.width as f64 + 1e-9
                    && ct + ch <= w.height as f64 + 1e-9
            );
        }
    }

    #[test]
    fn a_resized_crop_is_the_crop_of_a_full_decode_resized() {
        let (bytes, _) = jpeg(96, 128);
        let region = CropBox { top: 10, left: 20, height: 60, width: 80 };
        let (got, num) = resized_crop(&bytes, region, 32).unwrap();
        assert_eq!((got.len(), num), (32 * 32 * 3, 8));
        // The same crop of the whole decoded image, resized with the same edges.
        let info = with_decoder(|d| d.header(&bytes)).unwrap();
        let whole = WindowPlan {
            num: 8,
            window: Window { left: 0, top: 0, width: 128, height: 96 },
            crop: [20.0, 10.0, 80.0, 60.0],
            edges: Edges::Box,
        };
        let mut buffer = Vec::new();
        let image = whole.decode(&bytes, &info, &mut buffer).unwrap();
        let mut expected = Vec::new();
        resize_box(image, whole.crop, Edges::Box, 32, 32, &mut expected).unwrap();
        // Fancy upsampling at the window's edges may differ by a level or two.
        let worst = got.iter().zip(&expected).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        assert!(worst <= 3, "{worst}");
        // Bad input is an error.
        assert!(resized_crop(b"\xff\xd8\xffgarbage", region, 32).is_err());
    }
}
