//! JPEG decoding with libjpeg-turbo's TurboJPEG 3 API: read the header, then decode only a
//! window of the image, optionally DCT-scaled by `n/8` (the IDCT itself produces the smaller
//! image, so the work shrinks with the square of the scale).
//!
//! This is how tf.data's `decode_and_crop_jpeg`, PIL's draft mode and DALI's ROI decode avoid
//! paying for pixels a random crop throws away: rows below the window are never decoded, rows
//! above it are only entropy-decoded, and columns outside it skip the IDCT and colour
//! conversion.

use std::cell::RefCell;
use std::ffi::CStr;
use std::ptr::NonNull;
use turbojpeg_sys as tj;

/// iMCU width in pixels for each TurboJPEG subsampling code (`TJSAMP_444` = 0 … `TJSAMP_441`
/// = 6), as `tjMCUWidth` in `turbojpeg.h`, which the library does not export.
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];

/// What the header says about a JPEG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JpegInfo {
    /// Columns at full size.
    pub width: usize,
    /// Rows at full size.
    pub height: usize,
    /// Width in full-size pixels of one iMCU (8, 16 or 32 depending on chroma subsampling).
    pub mcu_width: usize,
    /// Whether TurboJPEG can decode a window of this image into 8-bit RGB (8-bit, lossy,
    /// known subsampling, not CMYK). Other JPEGs take the generic decoder.
    pub windowable: bool,
}

impl JpegInfo {
    /// Side length of the image scaled by `num/8`, as libjpeg computes it (rounded up).
    pub fn scaled(dimension: usize, num: usize) -> usize {
        (dimension * num).div_ceil(8)
    }

    /// Width of one iMCU in pixels of the image scaled by `num/8`: window left edges must be a
    /// multiple of it.
    pub fn scaled_mcu_width(&self, num: usize) -> usize {
        Self::scaled(self.mcu_width, num)
    }
}

/// A window of the scaled image to decode, in scaled pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First column; a multiple of [`JpegInfo::scaled_mcu_width`].
    pub left: usize,
    /// First row.
    pub top: usize,
    /// Columns.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

/// Whether `jpeg`'s markers reach a frame header (SOF0–SOF15) before the scan or the end: each
/// marker segment before it is skipped by its length, so this reads a few dozen bytes.
fn has_frame_header(jpeg: &[u8]) -> bool {
    let mut at = 2; // after SOI
    if !jpeg.starts_with(&[0xff, 0xd8]) {
        return true; // not a JPEG's start: TurboJPEG names what is wrong
    }
    while at + 1 < jpeg.len() {
        if jpeg[at] != 0xff {
            return false;
        }
        let marker = jpeg[at + 1];
        match marker {
            // Fill bytes before a marker.
            0xff => at += 1,
            // Markers without a segment: TEM, RST0–RST7, SOI.
            0x01 | 0xd0..=0xd8 => at += 2,
            // SOF0–SOF15, but DHT (C4), JPG (C8) and DAC (CC).
            0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => return true,
            // The scan, or the end, before any frame header.
            0xda | 0xd9 => return false,
            _ => {
                let Some(length) = jpeg.get(at + 2..at + 4) else { return false };
                at += 2 + usize::from(u16::from_be_bytes([length[0], length[1]]));
            }
        }
    }
    false
}

/// A TurboJPEG decompressor. Not shared between threads; [`with_decoder`] keeps one per thread.
pub struct TurboDecoder {
    handle: NonNull<std::ffi::c_void>,
}

impl Drop for TurboDecoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.handle.as_ptr()) }
    }
}

impl TurboDecoder {
    /// A new decompressor.
    pub fn new() -> Result<TurboDecoder, String> {
        let mut decoder = TurboDecoder { handle: Self::init()? };
        decoder.configure()?;
        Ok(decoder)
    }

    fn init() -> Result<NonNull<std::ffi::c_void>, String> {
        // SAFETY: plain constructor; a null return is handled.
        let raw = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        NonNull::new(raw).ok_or_else(|| "cannot start libjpeg-turbo".to_string())
    }

    fn configure(&mut self) -> Result<(), String> {
        // Skip copying ICC profiles out of every header: the pixels are all we use.
        self.set(tj::TJPARAM_TJPARAM_SAVEMARKERS, 0)?;
        // A progressive JPEG with thousands of scans is a denial of service, not an image.
        self.set(tj::TJPARAM_TJPARAM_SCANLIMIT, 500)?;
        self.set(tj::TJPARAM_TJPARAM_MAXPIXELS, crate::MAX_PIXELS as libc::c_int)
    }

    /// The message of the last error; then a fresh handle, because libjpeg's state after an
    /// error in the middle of a header or scan is not safe to reuse.
    fn fail(&mut self) -> String {
        let message = self.error();
        if let Ok(fresh) = Self::init() {
            let old = std::mem::replace(&mut self.handle, fresh);
            // SAFETY: `old` came from tj3Init and is no longer referenced.
            unsafe { tj::tj3Destroy(old.as_ptr()) };
            let _ = self.configure();
        }
        message
    }

    fn error(&self) -> String {
        // SAFETY: the handle is live; TurboJPEG returns a NUL-terminated static or per-handle
        // string, copied out at once.
        unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle.as_ptr())) }
            .to_string_lossy()
            .trim()
            .replace('\n', " ")
    }

    fn set(&mut self, param: tj::TJPARAM, value: libc::c_int) -> Result<(), String> {
        // SAFETY: the handle is live.
        let rc = unsafe { tj::tj3Set(self.handle.as_ptr(), param as libc::c_int, value) };
        if rc == 0 { Ok(()) } else { Err(self.error()) }
    }

    fn get(&self, param: tj::TJPARAM) -> libc::c_int {
        // SAFETY: the handle is live.
        unsafe { tj::tj3Get(self.handle.as_ptr(), param as libc::c_int) }
    }

    /// Reads the header of `jpeg`.
    pub fn header(&mut self, jpeg: &[u8]) -> Result<JpegInfo, String> {
        if jpeg.is_empty() {
            return Err("is empty".to_string());
        }
        // TurboJPEG reads a stream that ends before its frame header (a file cut short, or
        // tables only) without an error and leaves the previous image's size in place: that
        // size would pass for this image's.
        if !has_frame_header(jpeg) {
            return Err("has no frame header (the file is cut short, or holds tables only)".to_string());
        }
        // SAFETY: the buffer is valid for its length during the call.
        let rc = unsafe { tj::tj3DecompressHeader(self.handle.as_ptr(), jpeg.as_ptr(), jpeg.len() as _) };
        if rc != 0 {
            return Err(self.fail());
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        let subsamp = self.get(tj::TJPARAM_TJPARAM_SUBSAMP);
        let colorspace = self.get(tj::TJPARAM_TJPARAM_COLORSPACE);
        let precision = self.get(tj::TJPARAM_TJPARAM_PRECISION);
        let lossless = self.get(tj::TJPARAM_TJPARAM_LOSSLESS);
        if width < 1 || height < 1 {
            return Err(format!("has an invalid size of {width}×{height} pixels"));
        }
        let mcu_width = match u32::try_from(subsamp) {
            Ok(i) => MCU_WIDTH.get(i as usize).copied().unwrap_or(0),
            Err(_) => 0,
        };
        let windowable = mcu_width > 0
            && precision == 8
            && lossless == 0
            && u32::try_from(colorspace)
                .is_ok_and(|cs| matches!(cs, tj::TJCS_TJCS_YCbCr | tj::TJCS_TJCS_RGB | tj::TJCS_TJCS_GRAY));
        Ok(JpegInfo { width: width as usize, height: height as usize, mcu_width, windowable })
    }

    /// Decodes `window` of `jpeg` scaled by `num/8` (`num` in 1..=8) into the start of `out`
    /// as RGB rows of `window.width * 3` bytes (`out` grows when it is too short; bytes after
    /// the window are left as they were). `info` is this image's header, from
    /// [`TurboDecoder::header`].
    ///
    /// Safe for any arguments: the header is read again from `jpeg` itself (TurboJPEG parses
    /// the same bytes once more when it decodes, so the sizes checked here are the sizes it
    /// writes), an `info` that is not that header is an error, and the window and `out` are
    /// checked against it before TurboJPEG writes anything. Images over
    /// [`crate::MAX_SIDE`] pixels a side or [`crate::MAX_PIXELS`] in all are refused before
    /// `out` grows.
    ///
    /// Data warnings (e.g. a few extraneous bytes) are tolerated, as PIL and tf.data do; the
    /// image is decoded as far as the data goes.
    pub fn decode_window(
        &mut self,
        jpeg: &[u8],
        info: &JpegInfo,
        num: usize,
        window: Window,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        if !(1..=8).contains(&num) {
            return Err(format!("scale {num}/8 is not supported"));
        }
        // The header of these very bytes, never one cached by address: a buffer freed and
        // another allocated in its place would pass for the old one.
        let actual = self.header(jpeg)?;
        if actual != *info {
            return Err(format!(
                "the header given ({}×{} pixels) is not this JPEG's ({}×{} pixels); pass the \
                 header TurboDecoder::header read from the same bytes",
                info.width, info.height, actual.width, actual.height
            ));
        }
        let (width, height) = (actual.width, actual.height);
        if width > crate::MAX_SIDE || height > crate::MAX_SIDE || width * height > crate::MAX_PIXELS {
            return Err(format!(
                "is {width}×{height} pixels, over the limit of {} pixels a side and {} pixels in \
                 all",
                crate::MAX_SIDE,
                crate::MAX_PIXELS
            ));
        }
        let (sw, sh) = (JpegInfo::scaled(width, num), JpegInfo::scaled(height, num));
        let mcu = actual.scaled_mcu_width(num).max(1);
        let inside = window.width > 0
            && window.height > 0
            && window.left.is_multiple_of(mcu)
            && window.left.checked_add(window.width).is_some_and(|right| right <= sw)
            && window.top.checked_add(window.height).is_some_and(|bottom| bottom <= sh);
        if !inside {
            return Err(format!("window {window:?} does not fit the {sw}×{sh} image scaled by {num}/8"));
        }
        // TurboJPEG accepts only its own list of factors, in lowest terms (1/2, not 4/8).
        let common = gcd(num, 8);
        let factor =
            tj::tjscalingfactor { num: (num / common) as libc::c_int, denom: (8 / common) as libc::c_int };
        // SAFETY: the handle is live.
        if unsafe { tj::tj3SetScalingFactor(self.handle.as_ptr(), factor) } != 0 {
            return Err(self.fail());
        }
        let whole = window.left == 0 && window.top == 0 && window.width == sw && window.height == sh;
        let region = if whole {
            tj::tjregion { x: 0, y: 0, w: 0, h: 0 }
        } else {
            // All within the image, whose sides fit in a c_int (MAXPIXELS is set).
            tj::tjregion {
                x: window.left as libc::c_int,
                y: window.top as libc::c_int,
                w: window.width as libc::c_int,
                h: window.height as libc::c_int,
            }
        };
        // SAFETY: the handle is live; the header of `jpeg` was just read, so TurboJPEG checks
        // the region against this image.
        if unsafe { tj::tj3SetCroppingRegion(self.handle.as_ptr(), region) } != 0 {
            return Err(self.fail());
        }
        // Within MAX_SIDE × MAX_PIXELS (checked above): no overflow, and the pitch fits a c_int.
        let pitch = window.width * 3;
        // Every byte of the window is written; only grow, never clear (no zero-fill per image).
        let need = pitch * window.height;
        if out.len() < need {
            out.resize(need, 0);
        }
        // SAFETY: `out` holds at least `pitch * height` bytes, exactly what TurboJPEG writes for
        // the region: the window (all of the scaled image when `whole`) was checked against the
        // header of `jpeg`, which TurboJPEG reads again from the same bytes; the input buffer is
        // valid and unchanged (borrowed) for its length.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.handle.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len() as _,
                out.as_mut_ptr(),
                pitch as libc::c_int,
                tj::TJPF_TJPF_RGB,
            )
        };
        // SAFETY: the handle is live.
        if rc != 0
            && unsafe { tj::tj3GetErrorCode(self.handle.as_ptr()) } != tj::TJERR_TJERR_WARNING as libc::c_int
        {
            return Err(self.fail());
        }
        Ok(())
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

thread_local! {
    static DECODER: RefCell<Option<TurboDecoder>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's decoder, creating it on first use.
pub fn with_decoder<T>(f: impl FnOnce(&mut TurboDecoder) -> Result<T, String>) -> Result<T, String> {
    DECODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(TurboDecoder::new()?);
        }
        match slot.as_mut() {
            Some(decoder) => f(decoder),
            None => Err("cannot start libjpeg-turbo".to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::jpeg;

    #[test]
    fn header_and_full_decode() {
        let (bytes, pixels) = jpeg(37, 53);
        let mut d = TurboDecoder::new().unwrap();
        let info = d.header(&bytes).unwrap();
        assert_eq!((info.width, info.height), (53, 37));
        assert!(info.windowable);
        let mut out = Vec::new();
        let all = Window { left: 0, top: 0, width: 53, height: 37 };
        d.decode_window(&bytes, &info, 8, all, &mut out).unwrap();
        assert_eq!(out.len(), 53 * 37 * 3);
        let mae = out.iter().zip(&pixels).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / out.len() as f64;
        assert!(mae < 8.0, "{mae}");
    }

    #[test]
    fn a_window_equals_the_same_pixels_of_the_full_decode() {
        let (bytes, _) = jpeg(64, 96);
        let mut d = TurboDecoder::new().unwrap();
        let info = d.header(&bytes).unwrap();
        let mut full = Vec::new();
        d.decode_window(&bytes, &info, 8, Window { left: 0, top: 0, width: 96, height: 64 }, &mut full)
            .unwrap();
        let mcu = info.scaled_mcu_width(8);
        let w = Window { left: mcu, top: 5, width: 30, height: 21 };
        let info = d.header(&bytes).unwrap();
        let mut part = Vec::new();
        d.decode_window(&bytes, &info, 8, w, &mut part).unwrap();
        for y in 0..w.height {
            let src = &full[((w.top + y) * 96 + w.left) * 3..][..w.width * 3];
            let got = &part[y * w.width * 3..][..w.width * 3];
            // Fancy upsampling at the window's edges may differ by a level or two.
            let worst = src.iter().zip(got).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            assert!(worst <= 3, "row {y}: {worst}");
        }
    }

    #[test]
    fn scaled_decode_has_the_scaled_size() {
        let (bytes, _) = jpeg(50, 70);
        let mut d = TurboDecoder::new().unwrap();
        let info = d.header(&bytes).unwrap();
        let (sw, sh) = (JpegInfo::scaled(70, 4), JpegInfo::scaled(50, 4));
        assert_eq!((sw, sh), (35, 25));
        let mut out = Vec::new();
        d.decode_window(&bytes, &info, 4, Window { left: 0, top: 0, width: sw, height: sh }, &mut out)
            .unwrap();
        assert_eq!(out.len(), 35 * 25 * 3);
    }

    #[test]
    fn bad_input_and_bad_windows_are_errors_not_panics() {
        let mut d = TurboDecoder::new().unwrap();
        assert!(d.header(b"\xff\xd8\xffgarbage").is_err());
        assert!(d.header(b"").is_err());
        let (bytes, _) = jpeg(40, 40);
        let info = d.header(&bytes).unwrap();
        let mut out = Vec::new();
        // Misaligned left edge, out of bounds, unsupported scale.
        assert!(
            d.decode_window(&bytes, &info, 8, Window { left: 3, top: 0, width: 8, height: 8 }, &mut out)
                .is_err()
        );
        assert!(
            d.decode_window(&bytes, &info, 8, Window { left: 0, top: 0, width: 41, height: 8 }, &mut out)
                .is_err()
        );
        assert!(
            d.decode_window(&bytes, &info, 9, Window { left: 0, top: 0, width: 8, height: 8 }, &mut out)
                .is_err()
        );
        // Truncated data: decodes what is there or fails, never panics; the decoder stays usable.
        for cut in [10, 100, bytes.len() / 2] {
            let part = &bytes[..cut];
            if let Ok(info) = d.header(part) {
                let all = Window { left: 0, top: 0, width: info.width, height: info.height };
                let _ = d.decode_window(part, &info, 8, all, &mut out);
            }
        }
        let info = d.header(&bytes).unwrap();
        d.decode_window(&bytes, &info, 8, Window { left: 0, top: 0, width: 40, height: 40 }, &mut out)
            .unwrap();
    }
    /// TurboJPEG keeps the last image's size when a stream ends before its frame header: read
    /// after a good image, a cut one would pass for it.
    #[test]
    fn a_stream_cut_before_its_frame_header_is_an_error_after_a_good_one() {
        let mut d = TurboDecoder::new().unwrap();
        let (bytes, _) = jpeg(60, 80);
        let sof = bytes.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
        d.header(&bytes).unwrap();
        for cut in [2, 3, 20, sof, sof + 1] {
            let err = d.header(&bytes[..cut]).unwrap_err();
            assert!(err.contains("frame header"), "cut at {cut}: {err}");
        }
        assert!(d.header(&bytes[..sof + 11]).is_err(), "no scan: TurboJPEG's own error");
        assert_eq!(d.header(&bytes).unwrap().width, 80);
        let mut tables_only = bytes[..sof].to_vec();
        tables_only.extend_from_slice(&[0xff, 0xd9]);
        assert!(d.header(&tables_only).is_err());
    }

    #[test]
    fn a_header_of_other_bytes_is_an_error_not_a_write_out_of_bounds() {
        let mut d = TurboDecoder::new().unwrap();
        let (small, _) = jpeg(16, 16);
        let (large, _) = jpeg(64, 96);
        let small_info = d.header(&small).unwrap();
        let large_info = d.header(&large).unwrap();
        // The small image's header with the large image's bytes: a whole-image window of 16×16
        // would have TurboJPEG write 96×64 pixels into a 16×16 buffer.
        let whole = Window { left: 0, top: 0, width: 16, height: 16 };
        let mut out = Vec::new();
        let err = d.decode_window(&large, &small_info, 8, whole, &mut out).unwrap_err();
        assert!(err.contains("not this JPEG's") && err.contains("96×64"), "{err}");
        assert!(out.is_empty(), "nothing is written for a mismatched header");
        // The header read last was the small image's (same decoder): still refused.
        d.header(&small).unwrap();
        assert!(d.decode_window(&large, &small_info, 8, whole, &mut out).is_err());
        // A header claiming more than the bytes hold, and a made-up one.
        let all_large = Window { left: 0, top: 0, width: 96, height: 64 };
        assert!(d.decode_window(&small, &large_info, 8, all_large, &mut out).is_err());
        let made_up = JpegInfo { width: 1 << 20, height: 1 << 20, mcu_width: 0, windowable: true };
        let huge = Window { left: 0, top: 0, width: 1 << 20, height: 1 << 20 };
        assert!(d.decode_window(&small, &made_up, 8, huge, &mut out).is_err());
        // A window whose sides overflow when added: an error, not a panic.
        let wrapping = Window { left: 0, top: usize::MAX, width: 16, height: 2 };
        assert!(d.decode_window(&small, &small_info, 8, wrapping, &mut out).is_err());
        assert!(out.is_empty());
        // The same bytes in another buffer (another address) decode with their header.
        let copy = small.clone();
        d.decode_window(&copy, &small_info, 8, whole, &mut out).unwrap();
        assert_eq!(out.len(), 16 * 16 * 3);
    }
}
