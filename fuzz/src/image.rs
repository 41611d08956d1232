//! Image decoding: `image.decode`, the fused JPEG crop path, and TurboJPEG's windowed decode.

use crate::input::Input;
use granary_crds::{OpConfig, StageSpec};
use granary_image::jpeg::{JpegInfo, Window, with_decoder};
use granary_image::{Edges, PlannedImage, WindowPlan};
use granary_worker::element::{Element, Value};
use granary_worker::ops::Operator;
use granary_worker::ops::image::decode::{DecodeOp, decode_rgb8};
use granary_worker::ops::image::fused::{FusedCropOp, ImagePath};
use granary_worker::seed::SeededRng;
use std::sync::OnceLock;

/// Bytes of parameters before the image.
pub const PARAMS: usize = 10;

/// Largest window the target asks `decode_window` for, in pixels: larger ones are within the
/// limits but only cost time.
const MAX_WINDOW_PIXELS: usize = 1 << 22;

/// `image.decode → random_resized_crop → flip → normalize`, fused (the JPEG fast path).
fn fused() -> &'static FusedCropOp {
    static OP: OnceLock<FusedCropOp> = OnceLock::new();
    OP.get_or_init(|| {
        let stages: Vec<StageSpec> = match serde_json::from_str(
            r#"[{"op": "image.decode"}, {"op": "image.random_resized_crop", "size": 16},
                {"op": "image.flip"}, {"op": "image.normalize"}]"#,
        ) {
            Ok(stages) => stages,
            Err(e) => panic!("the fuzz target's stages do not parse: {e}"),
        };
        let configs: Vec<OpConfig> = stages
            .iter()
            .enumerate()
            .map(|(i, s)| match OpConfig::parse(s, &format!("stages[{i}]")) {
                Ok(c) => c,
                Err(e) => panic!("the fuzz target's stage {i} is invalid: {e:?}"),
            })
            .collect();
        match FusedCropOp::fuse(&configs, ImagePath::Fused) {
            Some((op, _)) => op,
            None => panic!("the fuzz target's stages do not fuse"),
        }
    })
}

/// Decodes the image after [`PARAMS`] bytes of parameters three ways: the `image.decode`
/// operator; the fused crop operator (seeded by byte 0); and `TurboDecoder::decode_window` with
/// a scale (byte 1), a window (bytes 2..10) and, when byte 1's high bit is set, a header that
/// is not this image's (the image's with its width changed by byte 0); then a plan of that
/// window with a box and an output from the same bytes (`PlannedImage::execute`); and the whole
/// input as a planned image's row (`granary_image::row::execute`). Every result must be an error
/// or an image of the size asked for.
pub fn image_decode(data: &[u8]) {
    let mut input = Input::new(data);
    let params = input.take(PARAMS);
    let image = input.rest();
    let param = |i: usize| params.get(i).copied().unwrap_or(0);
    let word = |i: usize| usize::from(u16::from_le_bytes([param(i), param(i + 1)]));

    if let Ok((height, width, pixels)) = decode_rgb8(image) {
        assert_eq!(pixels.len(), height * width * 3, "decode_rgb8 of {width}×{height}");
    }
    let op = DecodeOp::new(&granary_crds::ops::image::Decode { field: "image".into() });
    let mut element = Element::new("k");
    element.set("image", Value::Bytes(bytes::Bytes::copy_from_slice(image)));
    let mut rng = SeededRng::for_element(u64::from(param(0)), 0, 0, 0);
    let _ = op.apply(&mut element, &mut rng);

    let mut element = Element::new("k");
    element.set("image", Value::Bytes(bytes::Bytes::copy_from_slice(image)));
    if fused().run(&mut element, &mut rng).is_ok()
        && let Some(Value::Tensor(t)) = element.get("image")
    {
        assert_eq!(t.shape.iter().product::<usize>(), 16 * 16 * 3, "fused output {:?}", t.shape);
    }

    let num = usize::from(param(1) & 0x0f);
    let window = Window { left: word(2), top: word(4), width: word(6), height: word(8) };
    if window.width.saturating_mul(window.height) > MAX_WINDOW_PIXELS {
        return;
    }
    let _ = with_decoder(|decoder| {
        let info = decoder.header(image)?;
        let info = if param(1) & 0x80 != 0 {
            JpegInfo { width: info.width ^ usize::from(param(0)), ..info }
        } else {
            info
        };
        let mut out = Vec::new();
        decoder.decode_window(image, &info, num, window, &mut out)?;
        assert!(
            out.len() >= window.width * window.height * 3,
            "decode_window wrote past its buffer's length"
        );
        Ok(())
    });

    // A plan made elsewhere, executed on these bytes: the same window, a box in it from the
    // parameters (fractions of the window, some past its edges), a small output.
    let fraction = |i: usize| f64::from(param(i)) / 200.0 * window.width.max(1) as f64;
    let (rows, cols) = (usize::from(param(2) % 24) + 1, usize::from(param(3) % 24) + 1);
    let edges = if param(1) & 0x40 != 0 { Edges::Image } else { Edges::Box };
    let plan = PlannedImage {
        window: WindowPlan { num, window, crop: [fraction(4), fraction(5), fraction(6), fraction(7)], edges },
        rows,
        cols,
        height: rows + usize::from(param(8) % 4),
        width: cols + usize::from(param(9) % 4),
        top: usize::from(param(8) % 4),
        left: usize::from(param(9) % 4),
        flip: param(0) & 1 == 1,
    };
    let mut out = vec![0; plan.output_len()];
    let _ = plan.execute(image, &mut out);

    // The whole input as a planned image's row, as a trainer's client gets one from the wire.
    let (height, width) = (usize::from(param(2) % 24) + 1, usize::from(param(3) % 24) + 1);
    let mut out = vec![0; height * width * 3];
    let _ = granary_image::row::execute(data, height, width, &mut out);
}
