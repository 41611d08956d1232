//! The resize of a planned box: bilinear, antialiased when shrinking (PIL's and torchvision's
//! `antialias=True` convolution), with `fast_image_resize`'s SIMD kernels.

use crate::window::Edges;
use crate::{CropBox, RgbView};
use fast_image_resize as fr;
use std::cell::RefCell;

thread_local! {
    /// One resizer per thread, so that its scratch buffers are reused across images.
    static RESIZER: RefCell<fr::Resizer> = RefCell::new(fr::Resizer::new());
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
    let fail = |what: &dyn std::fmt::Display| {
        format!("resizing a {}×{} window failed: {what}", src.width, src.height)
    };
    // Within MAX_SIDE (checked by the planner and the decoder): fits in u32.
    let image = fr::images::ImageRef::new(src.width as u32, src.height as u32, src.data, fr::PixelType::U8x3)
        .map_err(|e| fail(&e))?;
    let need = rows * cols * 3;
    // Every byte is written by the resizer: only grow, never clear.
    if out.len() < need {
        out.resize(need, 0);
    }
    let mut dst =
        fr::images::Image::from_slice_u8(cols as u32, rows as u32, &mut out[..need], fr::PixelType::U8x3)
            .map_err(|e| fail(&e))?;
    let [left, top, width, height] = crop;
    let options = fr::ResizeOptions::new()
        .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
        .use_alpha(false);
    match edges {
        Edges::Box => {
            // Whole pixels around the box: the filter is clamped to them.
            let (x0, y0) = (left.floor(), top.floor());
            let x1 = (left + width).ceil().min(src.width as f64);
            let y1 = (top + height).ceil().min(src.height as f64);
            let around = fr::images::CroppedImage::new(
                &image,
                x0 as u32,
                y0 as u32,
                (x1 - x0) as u32,
                (y1 - y0) as u32,
            )
            .map_err(|e| fail(&e))?;
            let options = options.crop(left - x0, top - y0, width, height);
            RESIZER.with(|r| r.borrow_mut().resize(&around, &mut dst, &options)).map_err(|e| fail(&e))
        }
        Edges::Image => {
            // Rounding must not push the box past the window's edge, which the resizer refuses.
            let width = width.min(src.width as f64 - left);
            let height = height.min(src.height as f64 - top);
            let options = options.crop(left, top, width, height);
            RESIZER.with(|r| r.borrow_mut().resize(&image, &mut dst, &options)).map_err(|e| fail(&e))
        }
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
    let (w, h) = (src.width as u32, src.height as u32);
    let image = fr::images::ImageRef::new(w, h, src.data, fr::PixelType::U8x3).map_err(|e| fail(&e))?;
    let region = region.unwrap_or(CropBox { top: 0, left: 0, height: src.height, width: src.width });
    let in_bounds = region.height > 0
        && region.width > 0
        && region.top.checked_add(region.height).is_some_and(|b| b <= src.height)
        && region.left.checked_add(region.width).is_some_and(|r| r <= src.width);
    if !in_bounds {
        return Err(fail(&format_args!("crop box {region:?} is outside the image")));
    }
    let cropped = fr::images::CroppedImage::new(
        &image,
        region.left as u32,
        region.top as u32,
        region.width as u32,
        region.height as u32,
    )
    .map_err(|e| fail(&e))?;
    let mut out = fr::images::Image::new(out_width as u32, out_height as u32, fr::PixelType::U8x3);
    let options = fr::ResizeOptions::new()
        .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
        .use_alpha(false);
    RESIZER.with(|r| r.borrow_mut().resize(&cropped, &mut out, &options)).map_err(|e| fail(&e))?;
    Ok(out.into_vec())
}
