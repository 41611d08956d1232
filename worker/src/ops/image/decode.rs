//! `image.decode`: JPEG, PNG or WebP bytes → RGB `uint8` image of shape `[height, width, 3]`.

use super::{MAX_PIXELS, MAX_SIDE, missing_field, rgb_value};
use crate::contained::contained;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::image::Decode;
use image::codecs::jpeg::JpegDecoder;
use image::codecs::png::PngDecoder;
use image::codecs::webp::WebPDecoder;
use image::{DynamicImage, ImageDecoder, ImageError, Limits};
use std::io::Cursor;

const OP: &str = "image.decode";
pub(super) const JPEG_MAGIC: &[u8] = &[0xFF, 0xD8, 0xFF];
const PNG_MAGIC: &[u8] = &[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// Whether `bytes` start like a WebP file: a RIFF container of form `WEBP`.
fn is_webp(bytes: &[u8]) -> bool {
    bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP")
}

/// Bytes a decoder may allocate besides the pixels (PNG text and ICC chunks, which are
/// decompressed while the header is read): 64 MiB, the `png` crate's own default.
const MAX_DECODER_ALLOC: u64 = 64 << 20;

/// The `image` crate's limits for one decode: [`MAX_SIDE`] pixels a side, checked by each
/// decoder from the header, and [`MAX_DECODER_ALLOC`].
fn limits() -> Limits {
    let mut limits = Limits::default();
    // MAX_SIDE (16384) fits in a u32.
    limits.max_image_width = Some(MAX_SIDE as u32);
    limits.max_image_height = Some(MAX_SIDE as u32);
    limits.max_alloc = Some(MAX_DECODER_ALLOC);
    limits
}

/// The message for an image over the limits, phrased to follow "field `image` ".
fn oversized(format: &str, size: Option<(usize, usize)>) -> String {
    let size = size.map(|(w, h)| format!(" of {w}×{h} pixels")).unwrap_or_default();
    format!(
        "holds a {format}{size}, over the limit of {MAX_SIDE} pixels a side and {MAX_PIXELS} \
         pixels in all; downscale or drop such samples at the source"
    )
}

/// The message for a decoder's error: over the limits, or corrupt.
fn refused(format: &str, error: ImageError) -> String {
    match error {
        ImageError::Limits(_) => oversized(format, None),
        e => format!("holds a corrupt or unsupported {format}: {e}"),
    }
}

/// Decodes the encoded bytes in a field into an RGB `uint8` image, in place.
#[derive(Clone, Debug)]
pub struct DecodeOp {
    field: String,
}

impl DecodeOp {
    /// The operator for `config`.
    pub fn new(config: &Decode) -> DecodeOp {
        DecodeOp { field: config.field.clone() }
    }
}

/// The encoded image bytes in `field`, or an error that says what the field holds instead and
/// how to fix the spec.
pub(super) fn encoded_bytes<'a>(element: &'a Element, field: &str) -> Result<&'a bytes::Bytes, OpError> {
    match element.get(field) {
        None => Err(missing_field(OP, field, element)),
        Some(Value::Bytes(bytes)) => Ok(bytes),
        Some(Value::Tensor(t)) => Err(OpError::new(format!(
            "`{OP}`: field `{field}` holds a {} tensor of shape {:?}, not encoded bytes: \
             already decoded? Remove the second `image.decode`",
            t.dtype().name(),
            t.shape
        ))),
        Some(Value::Text(_)) => Err(OpError::new(format!(
            "`{OP}`: field `{field}` holds text, not encoded image bytes; set the \
             stage's `field` to the field with the JPEG, PNG or WebP bytes"
        ))),
    }
}

impl Operator for DecodeOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let field = &self.field;
        let bytes = encoded_bytes(element, field)?;
        let (height, width, data) =
            decode_rgb8(bytes).map_err(|why| OpError::new(format!("`{OP}`: field `{field}` {why}")))?;
        element.set(field, rgb_value(height, width, data));
        Ok(())
    }
}

/// Decodes JPEG, PNG or WebP `bytes` (told apart by their magic bytes) into RGB `uint8` pixels,
/// returning `(height, width, pixels)`. Grayscale, alpha and 16-bit images are converted to
/// 8-bit RGB (alpha is dropped, as PIL's `convert("RGB")` does). WebP may be lossy or lossless;
/// of an animated WebP the first frame is decoded. Images over [`MAX_SIDE`] pixels a side or
/// [`MAX_PIXELS`] in all are refused from their header, before their pixels are allocated (a
/// PNG right after its `IHDR` chunk, before any other chunk is read).
///
/// The error says what is wrong with the bytes, phrased to follow "field `image` ". A decoder
/// that panics on a malformed file gives an error too (see [`decoded`]).
pub fn decode_rgb8(bytes: &[u8]) -> Result<(usize, usize, Vec<u8>), String> {
    if bytes.starts_with(JPEG_MAGIC) {
        decoded("JPEG", || {
            let decoder = JpegDecoder::new(Cursor::new(bytes)).map_err(|e| refused("JPEG", e))?;
            finish(decoder, "JPEG")
        })
    } else if bytes.starts_with(PNG_MAGIC) {
        decoded("PNG", || {
            let decoder =
                PngDecoder::with_limits(Cursor::new(bytes), limits()).map_err(|e| refused("PNG", e))?;
            finish(decoder, "PNG")
        })
    } else if is_webp(bytes) {
        // The RIFF header gives the file's length. A lossless stream cut short decodes on as if
        // the rest were zero bits, however large the header says the image is (a 100-byte file
        // that says 13856×8192 took seconds and a gigabyte); libwebp, and so PIL, refuse it.
        let riff = bytes.get(4..8).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let whole = usize::try_from(riff).map_or(usize::MAX, |n| n.saturating_add(8));
        if bytes.len() < whole {
            return Err(format!(
                "is a WebP cut short: its header says {whole} bytes, but it has {}; the file is \
                 truncated (re-fetch or drop it)",
                bytes.len()
            ));
        }
        decoded("WebP", || {
            let decoder = WebPDecoder::new(Cursor::new(bytes)).map_err(|e| refused("WebP", e))?;
            finish(decoder, "WebP")
        })
    } else if bytes.is_empty() {
        Err("is empty (0 bytes), not a JPEG, PNG or WebP; drop empty samples from the source".into())
    } else {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Err(format!(
            "is not a JPEG, PNG or WebP: its {} bytes start with {}{}; only JPEG, PNG and \
             WebP can be decoded, so convert or drop such samples",
            bytes.len(),
            head.join(" "),
            other_format(bytes).map(|f| format!(" (looks like {f})")).unwrap_or_default(),
        ))
    }
}

/// Runs one of the `image` crate's pure-Rust decoders, a panic inside it being this file's
/// error (see [`contained`]): image-webp 0.2.4, the newest, builds an over-subscribed Huffman
/// code from a crafted lossless WebP and indexes past its table (image-rs/image-webp#118).
fn decoded<T>(format: &str, decode: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    contained(decode).unwrap_or_else(|why| {
        Err(format!(
            "holds a malformed {format} that made the decoder fail ({why}); drop such samples at \
             the source"
        ))
    })
}

/// Names a few common formats that are not supported, for the error message.
fn other_format(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"GIF8") {
        Some("GIF")
    } else if bytes.starts_with(b"BM") {
        Some("BMP")
    } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        Some("TIFF")
    } else if bytes.get(4..12).is_some_and(|b| b.starts_with(b"ftyp")) {
        Some("HEIF/AVIF or another ISO media file")
    } else {
        None
    }
}

/// Checks the size the header of `decoder` gives, then decodes: nothing the size of the image
/// is allocated before the check.
fn finish(mut decoder: impl ImageDecoder, format: &str) -> Result<(usize, usize, Vec<u8>), String> {
    let (w, h) = decoder.dimensions();
    let (w, h) = (w as usize, h as usize);
    if w == 0 || h == 0 {
        return Err(format!("holds a {format} of {w}×{h} pixels, which is empty; drop it"));
    }
    if w > MAX_SIDE || h > MAX_SIDE || w.saturating_mul(h) > MAX_PIXELS {
        return Err(oversized(format, Some((w, h))));
    }
    decoder.set_limits(limits()).map_err(|e| refused(format, e))?;
    let image = DynamicImage::from_decoder(decoder).map_err(|e| refused(format, e))?;
    let rgb = image.into_rgb8();
    let (w, h) = (rgb.width() as usize, rgb.height() as usize);
    Ok((h, w, rgb.into_raw()))
}

#[cfg(test)]
mod crafted;

#[cfg(test)]
mod tests {
    use super::crafted::{png_claiming, webp_claiming, webp_with_an_oversubscribed_code};
    use super::*;
    use crate::ops::image::test_images::pattern;
    use crate::tensor::{Tensor, TensorData};
    use image::codecs::jpeg::JpegEncoder;
    use image::codecs::png::PngEncoder;
    use image::codecs::webp::WebPEncoder;
    use image::{ExtendedColorType, ImageEncoder};

    fn png(data: &[u8], w: u32, h: u32, color: ExtendedColorType) -> Vec<u8> {
        let mut out = Vec::new();
        PngEncoder::new(&mut out).write_image(data, w, h, color).unwrap();
        out
    }

    fn jpeg(data: &[u8], w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        JpegEncoder::new_with_quality(&mut out, 95).write_image(data, w, h, ExtendedColorType::Rgb8).unwrap();
        out
    }

    fn run(bytes: Vec<u8>) -> Result<Element, OpError> {
        let mut e = Element::new("sample");
        e.set("image", Value::Bytes(bytes.into()));
        e.set("label", Value::Text("1".into()));
        let op = DecodeOp::new(&Decode { field: "image".into() });
        op.apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0))?;
        Ok(e)
    }

    fn tensor(e: &Element) -> &Tensor {
        match e.get("image") {
            Some(Value::Tensor(t)) => t,
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    #[test]
    fn png_rgb_decodes_exactly() {
        let pixels = pattern(17, 23);
        let e = run(png(&pixels, 23, 17, ExtendedColorType::Rgb8)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![17, 23, 3]);
        assert_eq!(t.data, TensorData::U8(pixels.into()));
        // The field keeps its place; other fields are untouched.
        assert_eq!(e.fields[0].0, "image");
        assert_eq!(e.get("label"), Some(&Value::Text("1".into())));
    }

    #[test]
    fn jpeg_decodes_to_rgb_close_to_the_source() {
        let pixels = pattern(32, 48);
        let e = run(jpeg(&pixels, 48, 32)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![32, 48, 3]);
        let TensorData::U8(got) = &t.data else { panic!("not uint8") };
        let mean_err: f64 = got.iter().zip(&pixels).map(|(a, b)| (*a as f64 - *b as f64).abs()).sum::<f64>()
            / pixels.len() as f64;
        assert!(mean_err < 8.0, "mean abs error {mean_err}");
    }

    #[test]
    fn grayscale_png_becomes_rgb() {
        let gray: Vec<u8> = (0..6 * 5).map(|i| (i * 8) as u8).collect();
        let e = run(png(&gray, 5, 6, ExtendedColorType::L8)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![6, 5, 3]);
        let expected: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
        assert_eq!(t.data, TensorData::U8(expected.into()));
    }

    #[test]
    fn rgba_png_drops_alpha() {
        let rgba: Vec<u8> = (0..4 * 3).flat_map(|i| [i as u8, 100 + i as u8, 200, (i * 20) as u8]).collect();
        let e = run(png(&rgba, 4, 3, ExtendedColorType::Rgba8)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![3, 4, 3]);
        let expected: Vec<u8> = rgba.chunks(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
        assert_eq!(t.data, TensorData::U8(expected.into()));
    }

    #[test]
    fn sixteen_bit_png_becomes_rgb8() {
        let values: Vec<u16> = (0..2 * 3 * 3).map(|i| (i as u16) * 3855).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let e = run(png(&bytes, 3, 2, ExtendedColorType::Rgb16)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![2, 3, 3]);
        let expected: Vec<u8> = values.iter().map(|v| (*v / 257) as u8).collect();
        assert_eq!(t.data, TensorData::U8(expected.into()));
    }

    #[test]
    fn corrupt_and_foreign_bytes_are_errors() {
        let err = run(b"GIF89a\x01\x00\x01\x00".to_vec()).unwrap_err();
        assert!(err.0.contains("not a JPEG, PNG or WebP") && err.0.contains("GIF"), "{err}");
        let err = run(Vec::new()).unwrap_err();
        assert!(err.0.contains("empty"), "{err}");
        let err = run([JPEG_MAGIC, b"garbage garbage garbage"].concat()).unwrap_err();
        assert!(err.0.contains("corrupt or unsupported JPEG"), "{err}");
        let err = run([PNG_MAGIC, b"garbage garbage garbage"].concat()).unwrap_err();
        assert!(err.0.contains("corrupt or unsupported PNG"), "{err}");
        let err = run(b"RIFF\x0f\0\0\0WEBPVP8 garbage".to_vec()).unwrap_err();
        assert!(err.0.contains("corrupt or unsupported WebP"), "{err}");

        // Truncated files: never a panic; PNG must fail, JPEG may decode what it has.
        let full = png(&pattern(40, 40), 40, 40, ExtendedColorType::Rgb8);
        assert!(run(full[..full.len() / 2].to_vec()).is_err());
        let full = jpeg(&pattern(40, 40), 40, 40);
        for cut in [4, 20, 100, full.len() / 2] {
            let _ = run(full[..cut].to_vec());
        }
    }

    fn webp_lossless(data: &[u8], w: u32, h: u32, color: ExtendedColorType) -> Vec<u8> {
        let mut out = Vec::new();
        WebPEncoder::new_lossless(&mut out).write_image(data, w, h, color).unwrap();
        out
    }

    #[test]
    fn a_webp_shorter_than_its_header_says_is_refused_before_decoding() {
        let whole = webp_lossless(&pattern(6, 5), 5, 6, ExtendedColorType::Rgb8);
        assert!(decode_rgb8(&whole).is_ok());
        for cut in [whole.len() - 1, 20] {
            let err = decode_rgb8(&whole[..cut]).unwrap_err();
            assert!(err.contains("WebP cut short") && err.contains(&format!("it has {cut}")), "{err}");
        }
        // Bytes after the RIFF chunk are left alone, as libwebp does.
        let mut longer = whole.clone();
        longer.extend_from_slice(b"trailing");
        assert!(decode_rgb8(&longer).is_ok());
    }

    #[test]
    fn lossless_webp_decodes_exactly() {
        let pixels = pattern(19, 13);
        let e = run(webp_lossless(&pixels, 13, 19, ExtendedColorType::Rgb8)).unwrap();
        let t = tensor(&e);
        assert_eq!(t.shape, vec![19, 13, 3]);
        assert_eq!(t.data, TensorData::U8(pixels.into()));
    }

    #[test]
    fn rgba_webp_drops_alpha_like_png() {
        let rgba: Vec<u8> =
            (0..5 * 4).flat_map(|i| [i as u8 * 9, 100 + i as u8, 7, 40 + (i * 10) as u8]).collect();
        let webp = run(webp_lossless(&rgba, 5, 4, ExtendedColorType::Rgba8)).unwrap();
        let png = run(png(&rgba, 5, 4, ExtendedColorType::Rgba8)).unwrap();
        assert_eq!(tensor(&webp).shape, vec![4, 5, 3]);
        assert_eq!(tensor(&webp), tensor(&png));
    }

    #[test]
    fn oversized_dimensions_are_refused_before_decoding() {
        // A valid 1×20000 PNG: the header alone must be enough to refuse it.
        let bytes = png(&vec![0u8; 20000 * 3], 20000, 1, ExtendedColorType::Rgb8);
        let err = run(bytes).unwrap_err();
        assert!(err.0.contains("over the limit"), "{err}");
    }

    #[test]
    fn tiny_png_claiming_a_huge_size_is_refused_from_its_header() {
        for (w, h) in [(1 << 20, 1 << 20), (MAX_SIDE as u32 + 1, 1), (1, u32::MAX >> 1)] {
            let bytes = png_claiming(w, h);
            assert!(bytes.len() < 64);
            let err = decode_rgb8(&bytes).unwrap_err();
            assert!(err.contains("PNG") && err.contains("over the limit"), "{w}×{h}: {err}");
        }
        // The same header within the limits gets as far as the missing image data.
        let err = decode_rgb8(&png_claiming(64, 64)).unwrap_err();
        assert!(err.contains("corrupt or unsupported PNG"), "{err}");
    }

    #[test]
    fn tiny_webp_claiming_a_huge_size_is_refused_from_its_header() {
        for (w, h) in [(20_000, 20_000), (MAX_SIDE as u32 + 1, 1), (1, 1 << 24)] {
            let bytes = webp_claiming(w, h);
            assert!(bytes.len() < 64);
            let err = decode_rgb8(&bytes).unwrap_err();
            assert!(err.contains("WebP") && err.contains("over the limit"), "{w}×{h}: {err}");
        }
        // Within the limits the header is accepted, and the 1×1 bitstream inside is refused.
        assert!(decode_rgb8(&webp_claiming(64, 64)).is_err());
    }

    #[test]
    fn a_file_that_panics_its_decoder_is_an_error() {
        let err = run(webp_with_an_oversubscribed_code()).unwrap_err();
        assert!(err.0.contains("field `image` holds a malformed WebP") && err.0.contains("drop"), "{err}");
        // The thread is still usable: the next file decodes.
        let pixels = pattern(3, 2);
        assert!(run(webp_lossless(&pixels, 2, 3, ExtendedColorType::Rgb8)).is_ok());
    }

    #[test]
    fn jpeg_whose_header_claims_a_huge_size_is_refused() {
        let mut bytes = jpeg(&pattern(8, 8), 8, 8);
        // The baseline SOF0 segment: FF C0, length, precision, then height and width.
        let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        bytes[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]); // 60000×60000
        let err = decode_rgb8(&bytes).unwrap_err();
        assert!(err.contains("JPEG") && (err.contains("over the limit") || err.contains("60000")), "{err}");
    }

    #[test]
    fn wrong_field_contents_are_errors() {
        let op = DecodeOp::new(&Decode { field: "image".into() });
        let mut rng = SeededRng::for_element(0, 0, 0, 0);
        let mut e = Element::new("k");
        e.set("jpg", Value::Bytes(bytes::Bytes::new()));
        let err = op.apply(&mut e, &mut rng).unwrap_err();
        assert!(err.0.contains("no field `image`") && err.0.contains("`jpg`"), "{err}");

        e.set("image", rgb_value(1, 1, vec![0, 0, 0]));
        let err = op.apply(&mut e, &mut rng).unwrap_err();
        assert!(err.0.contains("already decoded"), "{err}");

        e.set("image", Value::Text("x".into()));
        assert!(op.apply(&mut e, &mut rng).is_err());
    }
}
