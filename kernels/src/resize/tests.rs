use super::*;

/// A row-major RGB image of pseudo-random bytes.
fn pixels(rows: usize, width: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..rows * width * 3)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

/// Every kernel this CPU runs, the widest first.
fn every_kernel() -> impl Iterator<Item = Kernels> {
    [Kernels::Avx512, Kernels::Avx2, Kernels::Bytes].into_iter().filter(|&k| k <= Kernels::best())
}

/// The pass (up to `kernels`) over `rows` rows of a `width`-pixel image, the box `in0..in1` to
/// `out` pixels: the kernel's bytes and the pixel-by-pixel reference's.
fn both(
    kernels: Kernels,
    width: usize,
    in0: f64,
    in1: f64,
    out: usize,
    rows: usize,
) -> (Horizontal, Vec<u8>, Vec<u8>) {
    let mut pass = Horizontal::default();
    pass.limit(kernels);
    pass.bilinear(width, in0, in1, out);
    let image = pixels(rows, width, (width * 31 + out) as u64);
    let taps = pass.taps();
    // The rows the pass reads: from the first column any output reads.
    let (first, span) = (taps.first(), taps.source_width());
    let src: Vec<u8> =
        image.chunks_exact(width * 3).flat_map(|row| &row[first * 3..(first + span) * 3]).copied().collect();
    let mut got = vec![0xAB; rows * out * 3 + 5];
    pass.run(&src, &mut got);
    let mut expected = vec![0xAB; rows * out * 3 + 5];
    for (s, d) in src.chunks_exact(span * 3).zip(expected.chunks_exact_mut(out * 3)) {
        taps.resample_row(s, d);
    }
    (pass, got, expected)
}

#[test]
fn each_kernel_gives_the_references_bytes_shrinking_enlarging_and_at_every_remainder() {
    for kernels in every_kernel() {
        let mut cases = 0;
        for (width, in0, in1, out) in [
            (300, 0.0, 300.0, 224),
            (500, 37.25, 411.5, 224),
            (224, 0.0, 224.0, 224),
            (120, 3.5, 110.25, 224),
            (40, 0.0, 40.0, 224),
            (448, 0.0, 448.0, 224),
            (640, 10.0, 630.0, 160),
            (90, 1.0, 89.0, 17),
            (33, 0.0, 33.0, 1),
            (1000, 0.0, 1000.0, 224),
            (12, 0.0, 12.0, 7),
            (6, 0.25, 5.5, 3),
        ] {
            for out in [out, out + 1, out + 3, out + 13] {
                for rows in [1, 3] {
                    let (pass, got, expected) = both(kernels, width, in0, in1, out, rows);
                    assert_eq!(got, expected, "{kernels:?}: {width} px, {in0}..{in1} → {out}, {rows} rows");
                    cases += usize::from(pass.kernels() == kernels);
                }
            }
        }
        assert!(cases >= 30, "{kernels:?} ran {cases} of the cases");
    }
}

#[test]
fn weights_sum_to_one_and_a_resize_to_the_same_size_copies() {
    let mut pass = Horizontal::default();
    pass.bilinear(300, 12.5, 280.0, 224);
    let taps = pass.taps();
    assert_eq!(taps.len(), 224);
    let one = 1i32 << taps.precision();
    for i in 0..taps.len() {
        let sum: i32 = taps.of(i).1.iter().map(|&w| i32::from(w)).sum();
        assert!((sum - one).abs() <= 2, "output {i}: {sum} against {one}");
    }
    let (_, got, _) = both(Kernels::best(), 64, 0.0, 64.0, 64, 2);
    let image = pixels(2, 64, 64 * 31 + 64);
    assert_eq!(&got[..image.len()], image);
}

#[test]
fn a_shrink_too_steep_for_the_vectors_runs_pixel_by_pixel_with_the_same_bytes() {
    // Four neighbouring outputs of a 6× shrink read over 21 source pixels, and each output over
    // 5.
    for kernels in every_kernel() {
        let (pass, got, expected) = both(kernels, 1344, 0.0, 1344.0, 224, 2);
        assert!(!pass.vectors());
        assert_eq!(got, expected);
    }
}

#[test]
fn empty_and_degenerate_boxes_resample_nothing() {
    let mut pass = Horizontal::default();
    for (width, in0, in1, out) in
        [(0, 0.0, 0.0, 4), (10, 0.0, 10.0, 0), (10, 5.0, 5.0, 4), (10, 0.0, f64::NAN, 4)]
    {
        pass.bilinear(width, in0, in1, out);
        assert!(pass.taps().is_empty() && !pass.vectors());
        let mut dst = vec![7; 12];
        pass.run(&[1, 2, 3], &mut dst);
        assert_eq!(dst, [7; 12]);
    }
}

/// The vertical pass byte by byte, written out here as the reference.
pub(super) fn vertical_reference(taps: &Taps, src: &[u8], stride: usize, len: usize) -> Vec<u8> {
    let half = (1i32 << taps.precision()) >> 1;
    let mut out = Vec::new();
    for y in 0..taps.len() {
        let (start, weights) = taps.of(y);
        for x in 0..len {
            let sum: i32 = half
                + weights
                    .iter()
                    .enumerate()
                    .map(|(t, &w)| i32::from(w) * i32::from(src[(start + t) * stride + x]))
                    .sum::<i32>();
            out.push((sum >> taps.precision()).clamp(0, 255) as u8);
        }
    }
    out
}

#[test]
fn the_vertical_pass_gives_the_references_bytes_at_every_length_and_scale() {
    for (height, in0, in1, out) in [
        (300, 0.0, 300.0, 224),
        (120, 3.5, 110.25, 224),
        (448, 0.0, 448.0, 224),
        (1000, 2.0, 990.0, 100),
        (9, 0.0, 9.0, 9),
    ] {
        for (kernels, len) in every_kernel()
            .flat_map(|k| [1usize, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130, 672].map(|len| (k, len)))
        {
            let stride = len + 7;
            let mut pass = Vertical::default();
            pass.limit(kernels);
            pass.bilinear(height, in0, in1, out);
            let taps = pass.taps().clone();
            let image = pixels(height, stride.div_ceil(3) + 1, (height * 7 + len) as u64);
            // The rows the pass reads start at the taps' first row.
            let src = &image[taps.first() * stride..];
            let mut got = vec![0xAB; out * len + 3];
            pass.run(src, stride, len, &mut got);
            assert_eq!(
                got[..out * len],
                vertical_reference(&taps, src, stride, len),
                "{kernels:?} ({:?}): {height} rows → {out}, {len} bytes",
                pass.kernels(len)
            );
            assert_eq!(got[out * len..], [0xAB; 3], "nothing written past the output");
        }
    }
}

#[test]
fn a_vertical_pass_of_empty_rows_writes_nothing() {
    let mut pass = Vertical::default();
    pass.bilinear(10, 0.0, 10.0, 4);
    let mut dst = [7u8; 8];
    pass.run(&[1; 40], 4, 0, &mut dst);
    assert_eq!(dst, [7; 8]);
}

#[test]
#[should_panic(expected = "do not fit")]
fn a_vertical_pass_over_too_few_rows_is_refused() {
    let mut pass = Vertical::default();
    pass.bilinear(100, 0.0, 100.0, 50);
    pass.run(&[0; 99 * 10], 10, 10, &mut [0; 50 * 10]);
}

#[test]
fn kernels_are_named_as_the_environment_sets_them() {
    assert_eq!(Kernels::named("avx2"), Some(Kernels::Avx2));
    assert_eq!(Kernels::named(" AVX512\n"), Some(Kernels::Avx512));
    assert_eq!(Kernels::named("bytes"), Some(Kernels::Bytes));
    assert_eq!(Kernels::named("sse4"), None);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn wide_loads_stay_inside_the_source_in_the_rows_counted() {
    // Rows of 30 bytes, loads reaching 63 bytes into a row: a 100-byte source holds two such
    // rows' loads (row 1 reads to byte 93), not a third (row 2 would read to byte 123).
    assert_eq!(rows_within(100, 30, 63, 3), 2);
    assert_eq!(rows_within(100, 30, 63, 1), 1);
    assert_eq!(rows_within(62, 30, 63, 2), 0);
    assert_eq!(rows_within(63, 30, 63, 2), 1);
}
