//! Images the workers left to this host (placement of the image run on trainer hosts): a part
//! whose image tensor carries `images` holds one row per image, its plan and JPEG or the pixels
//! the worker made (`granary_image::row`). They are made here, with the worker's own code, so
//! the pixels are the same bytes, on threads of their own, as soon as the part arrives; the
//! rest of the client then sees the `uint8` tensor the worker would have sent.

use crate::host::Finishing;
use granary_proto::v1::{BatchPart, Tensor};

/// Fewest images a thread takes: fewer cost more to start a thread for than to make.
const IMAGES_PER_THREAD: usize = 4;

/// Whether `part` holds images to make.
pub(crate) fn has_plans(part: &BatchPart) -> bool {
    part.tensors.iter().any(|t| t.images.is_some())
}

/// Makes the images of every tensor of `part` that carries plans, on up to `threads` threads.
/// An error names the tensor and the element.
pub(crate) fn make(part: &mut BatchPart, threads: usize) -> Result<(), String> {
    for tensor in part.tensors.iter_mut().filter(|t| t.images.is_some()) {
        make_tensor(tensor, &part.keys, threads)?;
    }
    Ok(())
}

/// The threads this host gives to making images: every core, since the dispatcher sends plans
/// only while the host has idle ones, and moves them back when it has none.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn make_tensor(tensor: &mut Tensor, keys: &[String], threads: usize) -> Result<(), String> {
    let name = tensor.name.clone();
    let bad = |why: String| format!("tensor `{name}` holds image plans, but {why}");
    let lengths = tensor.images.take().map(|i| i.lengths).unwrap_or_default();
    let [rows, h, w, 3] = tensor.shape[..] else {
        return Err(bad(format!("its shape is {:?}, not [rows, height, width, 3]", tensor.shape)));
    };
    if tensor.dtype != "uint8" {
        return Err(bad(format!("its dtype is {}, not uint8", tensor.dtype)));
    }
    let [rows, h, w] = [rows, h, w].map(|d| usize::try_from(d).unwrap_or(usize::MAX));
    if h == 0 || w == 0 || h > granary_image::MAX_SIDE || w > granary_image::MAX_SIDE {
        return Err(bad(format!("its images are {w}×{h} pixels")));
    }
    if lengths.len() != rows {
        return Err(bad(format!("it has {} rows and {} row lengths", rows, lengths.len())));
    }
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0usize);
    for &length in &lengths {
        let end = usize::try_from(length).ok().and_then(|l| offsets.last().and_then(|o| o.checked_add(l)));
        match end {
            Some(end) if end <= tensor.data.len() => offsets.push(end),
            _ => {
                return Err(bad(format!(
                    "its row lengths add up to more than its {} bytes",
                    tensor.data.len()
                )));
            }
        }
    }
    if offsets.last() != Some(&tensor.data.len()) {
        return Err(bad(format!("its row lengths do not add up to its {} bytes", tensor.data.len())));
    }
    let image = h * w * 3;
    let total =
        image.checked_mul(rows).ok_or_else(|| bad(format!("{rows} images of {w}×{h} are too many")))?;
    let mut out = vec![0u8; total];
    let data = &tensor.data;
    let threads = threads.clamp(1, rows.div_ceil(IMAGES_PER_THREAD).max(1));
    let per = rows.div_ceil(threads).max(1);
    let failed = std::thread::scope(|scope| {
        let tasks: Vec<_> = out
            .chunks_mut(per * image)
            .enumerate()
            .map(|(chunk, images)| {
                let offsets = &offsets;
                scope.spawn(move || {
                    // Each thread counts its own CPU time: the host's share is the sum.
                    let stretch = Finishing::images();
                    let failed = images.chunks_exact_mut(image).enumerate().find_map(|(i, pixels)| {
                        let row = chunk * per + i;
                        let bytes = &data[offsets[row]..offsets[row + 1]];
                        granary_image::row::execute(bytes, h, w, pixels).err().map(|why| (row, why))
                    });
                    stretch.end();
                    failed
                })
            })
            .collect();
        tasks
            .into_iter()
            .find_map(|task| task.join().unwrap_or_else(|_| Some((0, "a thread panicked".into()))))
    });
    if let Some((row, why)) = failed {
        let key = keys.get(row).map_or("?", String::as_str);
        return Err(format!(
            "tensor `{name}`: the image of element `{key}` could not be made on this host: {why}"
        ));
    }
    tensor.data = out.into();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::v1::ImageRows;

    fn pixel_rows(rows: usize, h: usize, w: usize) -> (Tensor, Vec<u8>) {
        let mut data = Vec::new();
        let mut lengths = Vec::new();
        let mut expected = Vec::new();
        for r in 0..rows {
            let pixels: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 + r * 13) as u8).collect();
            let before = data.len();
            granary_image::row::encode_pixels(&pixels, &mut data);
            lengths.push((data.len() - before) as u64);
            expected.extend_from_slice(&pixels);
        }
        let tensor = Tensor {
            name: "image".into(),
            dtype: "uint8".into(),
            shape: vec![rows as u64, h as u64, w as u64, 3],
            data: data.into(),
            images: Some(ImageRows { lengths }),
            ..Default::default()
        };
        (tensor, expected)
    }

    fn part(tensor: Tensor) -> BatchPart {
        let rows = tensor.shape[0];
        BatchPart {
            hi: rows,
            keys: (0..rows).map(|i| format!("k{i}")).collect(),
            tensors: vec![tensor],
            ..Default::default()
        }
    }

    #[test]
    fn rows_become_the_images_in_order_on_any_number_of_threads() {
        for (rows, threads) in [(0, 4), (1, 4), (9, 1), (9, 2), (37, 3), (37, 64)] {
            let (tensor, expected) = pixel_rows(rows, 3, 5);
            let mut p = part(tensor);
            assert!(has_plans(&p));
            make(&mut p, threads).unwrap();
            assert!(!has_plans(&p));
            assert_eq!(p.tensors[0].data, expected, "{rows} rows on {threads} threads");
            assert_eq!(p.tensors[0].shape, [rows as u64, 3, 5, 3]);
        }
    }

    #[test]
    fn malformed_rows_are_errors_naming_the_element() {
        let (tensor, _) = pixel_rows(6, 3, 5);
        type Damage = Box<dyn Fn(&mut Tensor)>;
        let cases: Vec<(Damage, &str)> = vec![
            (Box::new(|t| t.shape = vec![6, 3, 5]), "shape"),
            (Box::new(|t| t.dtype = "float32".into()), "dtype"),
            (Box::new(|t| t.images = Some(ImageRows { lengths: vec![46; 5] })), "row lengths"),
            (Box::new(|t| t.images = Some(ImageRows { lengths: vec![46, 46, 46, 46, 46, 47] })), "add up"),
            (
                Box::new(|t| t.images = Some(ImageRows { lengths: vec![46, 46, 46, 46, 45, 47] })),
                "element `k4`",
            ),
            (Box::new(|t| t.shape = vec![6, 0, 5, 3]), "pixels"),
        ];
        for (damage, expected) in cases {
            let mut damaged = tensor.clone();
            damage(&mut damaged);
            let err = make(&mut part(damaged), 2).unwrap_err();
            assert!(err.contains(expected) && err.contains("`image`"), "{expected}: {err}");
        }
    }
}
