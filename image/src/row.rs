//! One image as it travels when the consumer's host makes its pixels (placement of the image
//! run on trainer hosts): the plan and the encoded JPEG, or the pixels the worker made itself
//! for an image it could not plan (a PNG, a JPEG libjpeg-turbo cannot window).
//!
//! The layout is little-endian and fixed:
//!
//! | bytes | what |
//! |-------|------|
//! | 1 | kind: [`PIXELS`] or [`PLANNED`] |
//!
//! For [`PIXELS`], the RGB `uint8` output (`height × width × 3`) follows. For [`PLANNED`]:
//!
//! | bytes | what |
//! |-------|------|
//! | 1 | DCT scale numerator (over 8) |
//! | 1 | edges: 0 box, 1 image |
//! | 1 | flip: 0 or 1 |
//! | 4 × 4 | window: left, top, width, height (`u32`) |
//! | 4 × 8 | box in the window: left, top, width, height (`f64`) |
//! | 6 × 4 | resized rows, columns; output height, width; top, left (`u32`) |
//! | rest | the JPEG |
//!
//! Decoding checks only the layout; [`PlannedImage::execute`] checks that a plan fits its
//! output and its JPEG, so a damaged row is an error, never a write out of bounds.

use crate::jpeg::Window;
use crate::{Edges, PlannedImage, WindowPlan};

/// Kind byte of a row holding finished pixels.
pub const PIXELS: u8 = 0;
/// Kind byte of a row holding a plan and its JPEG.
pub const PLANNED: u8 = 1;
/// Bytes of a planned row before the JPEG.
pub const PLAN_BYTES: usize = 1 + 3 + 4 * 4 + 4 * 8 + 6 * 4;

/// One decoded row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Row<'a> {
    /// Finished RGB pixels.
    Pixels(&'a [u8]),
    /// A plan and the JPEG it was made from.
    Planned(PlannedImage, &'a [u8]),
}

/// Appends the row of a planned image to `out`.
pub fn encode_planned(plan: &PlannedImage, jpeg: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let u32_of = |value: usize, what: &str| {
        u32::try_from(value).map_err(|_| format!("the plan's {what} ({value}) does not fit 32 bits"))
    };
    let w = plan.window.window;
    let sizes = [
        (w.left, "window's left edge"),
        (w.top, "window's top edge"),
        (w.width, "window's width"),
        (w.height, "window's height"),
        (plan.rows, "rows"),
        (plan.cols, "columns"),
        (plan.height, "height"),
        (plan.width, "width"),
        (plan.top, "top"),
        (plan.left, "left"),
    ]
    .into_iter()
    .map(|(value, what)| u32_of(value, what))
    .collect::<Result<Vec<u32>, String>>()?;
    let num = u8::try_from(plan.window.num).map_err(|_| format!("scale {}/8 is not one", plan.window.num))?;
    out.reserve(PLAN_BYTES + jpeg.len());
    out.extend_from_slice(&[PLANNED, num, u8::from(plan.window.edges == Edges::Image), u8::from(plan.flip)]);
    for value in &sizes[..4] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in plan.window.crop {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in &sizes[4..] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(jpeg);
    Ok(())
}

/// Appends the row of finished pixels to `out`.
pub fn encode_pixels(pixels: &[u8], out: &mut Vec<u8>) {
    out.reserve(1 + pixels.len());
    out.push(PIXELS);
    out.extend_from_slice(pixels);
}

/// Reads a row written by [`encode_planned`] or [`encode_pixels`].
pub fn decode(row: &[u8]) -> Result<Row<'_>, String> {
    match row.split_first() {
        Some((&PIXELS, pixels)) => Ok(Row::Pixels(pixels)),
        Some((&PLANNED, rest)) => {
            if rest.len() < PLAN_BYTES - 1 {
                return Err(format!("a planned image's row has {} bytes, fewer than a plan's", row.len()));
            }
            let (head, jpeg) = rest.split_at(PLAN_BYTES - 1);
            let (flags, numbers) = head.split_at(3);
            let (windows, rest) = numbers.split_at(16);
            let (crop, sizes) = rest.split_at(32);
            let u32s = |bytes: &[u8]| -> Vec<usize> {
                bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).collect()
            };
            let edges = match flags[1] {
                0 => Edges::Box,
                1 => Edges::Image,
                other => return Err(format!("a planned image's row has edges {other}, not 0 or 1")),
            };
            let flip = match flags[2] {
                0 => false,
                1 => true,
                other => return Err(format!("a planned image's row has flip {other}, not 0 or 1")),
            };
            let [left, top, width, height] = u32s(windows)[..] else { unreachable!("16 bytes") };
            let mut boxed = [0.0; 4];
            for (value, bytes) in boxed.iter_mut().zip(crop.chunks_exact(8)) {
                let mut b = [0; 8];
                b.copy_from_slice(bytes);
                *value = f64::from_le_bytes(b);
            }
            let [rows, cols, out_height, out_width, out_top, out_left] = u32s(sizes)[..] else {
                unreachable!("24 bytes")
            };
            let plan = PlannedImage {
                window: WindowPlan {
                    num: usize::from(flags[0]),
                    window: Window { left, top, width, height },
                    crop: boxed,
                    edges,
                },
                rows,
                cols,
                height: out_height,
                width: out_width,
                top: out_top,
                left: out_left,
                flip,
            };
            Ok(Row::Planned(plan, jpeg))
        }
        Some((kind, _)) => Err(format!("an image row of kind {kind}, neither pixels (0) nor a plan (1)")),
        None => Err("an empty image row".to_string()),
    }
}

/// Makes the pixels of `row` into `out` (RGB `uint8`, `height × width × 3`): executes its plan,
/// or copies its pixels. A plan made for another output size is an error.
pub fn execute(row: &[u8], height: usize, width: usize, out: &mut [u8]) -> Result<(), String> {
    match decode(row)? {
        Row::Pixels(pixels) => {
            if pixels.len() != out.len() {
                return Err(format!(
                    "a row of {} pixel bytes, where a {width}×{height} image has {}",
                    pixels.len(),
                    out.len()
                ));
            }
            out.copy_from_slice(pixels);
            Ok(())
        }
        Row::Planned(plan, jpeg) => {
            if (plan.height, plan.width) != (height, width) {
                return Err(format!(
                    "a plan for a {}×{} output in a tensor of {width}×{height} images",
                    plan.width, plan.height
                ));
            }
            plan.execute(jpeg, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CropBox;
    use crate::jpeg::with_decoder;
    use crate::test_images::jpeg;

    fn plan(bytes: &[u8], flip: bool) -> PlannedImage {
        let info = with_decoder(|d| d.header(bytes)).unwrap();
        let region = CropBox { top: 3, left: 9, height: 50, width: 41 };
        let window = WindowPlan::crop(&info, region, 16);
        PlannedImage { window, rows: 16, cols: 16, height: 16, width: 16, top: 0, left: 0, flip }
    }

    #[test]
    fn a_planned_row_executes_to_the_plans_pixels() {
        let (bytes, _) = jpeg(60, 80);
        for flip in [false, true] {
            let planned = plan(&bytes, flip);
            let mut row = Vec::new();
            encode_planned(&planned, &bytes, &mut row).unwrap();
            assert_eq!(row.len(), PLAN_BYTES + bytes.len());
            assert_eq!(decode(&row).unwrap(), Row::Planned(planned, &bytes[..]));
            let (mut direct, mut carried) = (vec![0; 16 * 16 * 3], vec![1; 16 * 16 * 3]);
            planned.execute(&bytes, &mut direct).unwrap();
            execute(&row, 16, 16, &mut carried).unwrap();
            assert_eq!(direct, carried);
        }
        let image_edges = PlannedImage {
            window: WindowPlan { edges: Edges::Image, ..plan(&bytes, false).window },
            ..plan(&bytes, false)
        };
        let mut row = Vec::new();
        encode_planned(&image_edges, &bytes, &mut row).unwrap();
        assert_eq!(decode(&row).unwrap(), Row::Planned(image_edges, &bytes[..]));
    }

    #[test]
    fn a_pixel_row_is_copied() {
        let pixels: Vec<u8> = (0..2 * 3 * 3).map(|i| i as u8).collect();
        let mut row = Vec::new();
        encode_pixels(&pixels, &mut row);
        let mut out = vec![0; pixels.len()];
        execute(&row, 2, 3, &mut out).unwrap();
        assert_eq!(out, pixels);
        assert!(execute(&row, 3, 3, &mut [0; 27]).is_err(), "the wrong size");
    }

    #[test]
    fn damaged_rows_are_errors() {
        let (bytes, _) = jpeg(60, 80);
        let mut row = Vec::new();
        encode_planned(&plan(&bytes, false), &bytes, &mut row).unwrap();
        let mut out = vec![0; 16 * 16 * 3];
        assert!(execute(&[], 16, 16, &mut out).is_err());
        assert!(execute(&[7, 1, 2], 16, 16, &mut out).is_err());
        assert!(execute(&row[..PLAN_BYTES - 1], 16, 16, &mut out).is_err(), "cut in the plan");
        assert!(execute(&row[..PLAN_BYTES + 20], 16, 16, &mut out).is_err(), "cut in the JPEG");
        assert!(execute(&row, 16, 17, &mut out).is_err(), "another output size");
        for (at, value) in [(1, 9), (1, 0), (2, 2), (3, 2)] {
            let mut bad = row.clone();
            bad[at] = value;
            assert!(execute(&bad, 16, 16, &mut out).is_err(), "byte {at} set to {value}");
        }
        // Every byte of the plan set to 0xff: an error each time, never a panic.
        for at in 1..PLAN_BYTES {
            let mut bad = row.clone();
            bad[at] = 0xff;
            let _ = execute(&bad, 16, 16, &mut out);
        }
        execute(&row, 16, 16, &mut out).unwrap();
    }
}
