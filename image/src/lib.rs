//! Image work that runs on either side of the wire: libjpeg-turbo's windowed, DCT-scaled decode
//! and the resize of a planned box, as the worker's fused image operators run them.
//!
//! The worker plans each image from its JPEG header and the element's random draws
//! ([`window::WindowPlan`]: the DCT scale, the window of the scaled image to decode, and the
//! box within it to resize); executing a plan needs nothing else. Kept apart from the worker so
//! that the same code, and so the same bytes, can run wherever a plan is executed. Depends on
//! nothing of ours but `granary-kernels` (the mirror).
//!
//! - [`jpeg`]: TurboJPEG 3's header read and windowed decode, one decoder per thread.
//! - [`window`]: the plans, for a random resized crop and for a resize and centre crop.
//! - [`planned`]: one image's plan complete with its output (size, placement, flip), executed
//!   from the JPEG's bytes alone.
//! - [`row`]: one image as it travels to a consumer that makes its pixels: the plan and the
//!   JPEG, or the pixels the worker made.
//! - [`resize`]: the bilinear, antialiased resize of a planned box or a whole region: by
//!   `granary_kernels::resize` where the CPU has AVX2 or AVX-512 VBMI and VNNI, otherwise by
//!   `fast_image_resize`, every use of which lives here (its code is instantiated once). Both
//!   give the same bytes.

pub mod jpeg;
pub mod planned;
pub mod resize;
pub mod row;
pub mod window;

pub use planned::PlannedImage;
pub use resize::{Edges, resize_box, resize_region};
pub use window::{WindowPlan, choose_scale, resized_crop};

/// Largest accepted side of an image, in pixels (decoded or produced by an operator).
pub const MAX_SIDE: usize = 16384;

/// Largest accepted number of pixels of an image (2^28, 768 MiB as RGB `uint8`).
pub const MAX_PIXELS: usize = 1 << 28;

/// A borrowed decoded image: RGB `uint8`, `height × width × 3`, row-major.
#[derive(Clone, Copy, Debug)]
pub struct RgbView<'a> {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// `height * width * 3` bytes: R, G, B of each pixel, row by row.
    pub data: &'a [u8],
}

/// A box within an image, in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// Test images generated in code, for this crate's tests and (with the `test-images` feature)
/// other crates' tests.
#[cfg(any(test, feature = "test-images"))]
pub mod test_images {
    /// A `height × width` RGB image with gradients and a checker pattern, so that every
    /// pixel differs from its neighbours and mistakes in indexing show.
    pub fn pattern(height: usize, width: usize) -> Vec<u8> {
        let mut data = Vec::with_capacity(height * width * 3);
        for y in 0..height {
            for x in 0..width {
                let checker = if (x / 4 + y / 4) % 2 == 0 { 0 } else { 64 };
                data.push(((x * 255) / width.max(1)) as u8);
                data.push(((y * 255) / height.max(1)) as u8);
                data.push(((x * 7 + y * 13) % 192 + checker) as u8);
            }
        }
        data
    }

    /// [`pattern`] as a quality-95 JPEG, with its pixels.
    #[cfg(test)]
    pub fn jpeg(height: usize, width: usize) -> (Vec<u8>, Vec<u8>) {
        use image::codecs::jpeg::JpegEncoder;
        use image::{ExtendedColorType, ImageEncoder};
        let pixels = pattern(height, width);
        let mut out = Vec::new();
        JpegEncoder::new_with_quality(&mut out, 95)
            .write_image(&pixels, width as u32, height as u32, ExtendedColorType::Rgb8)
            .unwrap();
        (out, pixels)
    }
}
