//! A pipeline's final `float32` `image.normalize`, applied to whole batches as they leave the
//! executor instead of to each element.
//!
//! Per element, the normalization writes four bytes per pixel channel that then wait in the
//! shuffle buffer (1024 float32 ImageNet images are 616 MB) and are copied into the batch: a
//! write, a read from memory long since out of the caches, and another write. Per batch, the
//! elements stay `uint8` until they are stacked (a quarter of the bytes to hold and copy), and
//! one pass reads each image once and writes its `float32` values once, into the batch. The
//! tables are `granary_kernels`' as everywhere else, so the values are the same bits.

use super::{Batch, BatchTensor};
use crate::tensor::DType;
use granary_kernels::normalize::{Layout, Lut, Stores, lut, normalize_into, normalize_over};
use std::cell::RefCell;

/// Images one thread finishes per batch before another thread is worth starting.
const IMAGES_PER_THREAD: usize = 16;

/// The normalization of one field, finished per batch.
#[derive(Debug)]
pub struct Finish {
    field: String,
    table: Box<Lut>,
    layout: Layout,
    /// Threads that share the pass over one batch (at least 1).
    threads: usize,
}

thread_local! {
    /// One image's `float32` values, reused, when the batch's buffer cannot be written as floats.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Finish {
    /// The normalization of `field` by per-channel `mean` and `std` into `layout`, one pass over
    /// each batch shared by up to `threads` threads.
    pub fn new(field: &str, mean: [f32; 3], std: [f32; 3], layout: Layout, threads: usize) -> Finish {
        Finish { field: field.to_string(), table: Box::new(lut(mean, std)), layout, threads: threads.max(1) }
    }

    /// The field it normalizes.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Normalizes the field's tensor of `batch` (`uint8` `[rows, h, w, 3]`) into `float32` in
    /// place, reading its images from the elements' buffers where the builder left the field
    /// unstacked. A batch without the field is left as it is; a field of another form is an
    /// error naming it. The batch comes out stacked either way.
    pub fn apply(&self, batch: &mut Batch) -> Result<(), String> {
        let Some(index) = batch.tensors.iter().position(|t| t.name == self.field) else {
            batch.stack();
            return Ok(());
        };
        if batch.unstacked.as_ref().is_some_and(|u| u.tensor != index) {
            batch.stack();
        }
        let unstacked = batch.unstacked.take().map(|u| u.rows);
        let tensor = &mut batch.tensors[index];
        let [rows, h, w, 3] = tensor.shape[..] else {
            return Err(self.wrong(tensor, unstacked.as_deref()));
        };
        let image = h * w * 3;
        let images: Vec<&[u8]> = match &unstacked {
            _ if image == 0 => Vec::new(),
            Some(own) => own.iter().map(Vec::as_slice).collect(),
            None => tensor.data.chunks(image).collect(),
        };
        let whole = images.len() == rows && images.iter().all(|one| one.len() == image);
        if tensor.dtype != DType::Uint8 || (image > 0 && !whole) {
            return Err(self.wrong(tensor, unstacked.as_deref()));
        }
        let mut out = crate::buffers::take_filled(rows * image * 4);
        if image > 0 {
            match bytemuck::try_cast_slice_mut::<u8, f32>(&mut out) {
                Ok(values) => self.over(&images, image, values),
                // A buffer not aligned for floats (allocators align buffers this large to 16
                // bytes, but nothing promises it): through a scratch image instead.
                Err(_) => {
                    out.clear();
                    self.appended(&images, w, &mut out);
                }
            }
        }
        tensor.shape = match self.layout {
            Layout::Hwc => vec![rows, h, w, 3],
            Layout::Chw => vec![rows, 3, h, w],
        };
        tensor.dtype = DType::Float32;
        crate::buffers::give(std::mem::replace(&mut tensor.data, out));
        Ok(())
    }

    /// Writes the `float32` values of `images` (`image` bytes each, `image > 0`) over `values`,
    /// the images shared out in contiguous runs among up to `self.threads` threads.
    fn over(&self, images: &[&[u8]], image: usize, values: &mut [f32]) {
        let threads = self.threads.min(images.len().div_ceil(IMAGES_PER_THREAD)).max(1);
        let per = images.len().div_ceil(threads);
        let stores = Stores::for_output(std::mem::size_of_val(values));
        let run = |src: &[&[u8]], dst: &mut [f32]| {
            for (one, out) in src.iter().zip(dst.chunks_exact_mut(image)) {
                normalize_over(one, &self.table, self.layout, stores, out);
            }
        };
        if threads == 1 {
            return run(images, values);
        }
        std::thread::scope(|scope| {
            let mut runs = images.chunks(per).zip(values.chunks_mut(per * image));
            let first = runs.next();
            for (src, dst) in runs {
                scope.spawn(move || run(src, dst));
            }
            if let Some((src, dst)) = first {
                run(src, dst);
            }
        });
    }

    /// Appends the `float32` values of `images` (rows of `w` pixels) to `out`, one image at a
    /// time through a scratch buffer.
    fn appended(&self, images: &[&[u8]], w: usize, out: &mut Vec<u8>) {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            for one in images {
                scratch.clear();
                normalize_into(one, w, &self.table, self.layout, false, &mut scratch);
                out.extend_from_slice(bytemuck::cast_slice(&scratch));
            }
        });
    }

    fn wrong(&self, tensor: &BatchTensor, unstacked: Option<&[Vec<u8>]>) -> String {
        let bytes = match unstacked {
            Some(rows) => {
                let (least, most) = (rows.iter().map(Vec::len).min(), rows.iter().map(Vec::len).max());
                format!("{} rows of {}–{} bytes", rows.len(), least.unwrap_or(0), most.unwrap_or(0))
            }
            None => format!("{} bytes", tensor.data.len()),
        };
        format!(
            "`image.normalize` finishes field `{}` per batch, which needs uint8 images [rows, height, \
             width, 3], but the batch holds {} {:?} in {bytes}",
            self.field,
            tensor.dtype.name(),
            tensor.shape
        )
    }
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use crate::element::{Element, Value};
    use crate::tensor::{Tensor, TensorData};

    const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    const STD: [f32; 3] = [0.229, 0.224, 0.225];

    fn batch(rows: usize, h: usize, w: usize) -> Batch {
        let n = rows * h * w * 3;
        Batch {
            epoch: 0,
            origin: None,
            keys: (0..rows).map(|i| i.to_string()).collect(),
            tensors: vec![
                BatchTensor {
                    name: "image".into(),
                    dtype: DType::Uint8,
                    shape: vec![rows, h, w, 3],
                    data: (0..n).map(|i| (i * 37 % 251) as u8).collect(),
                },
                BatchTensor {
                    name: "label".into(),
                    dtype: DType::Int64,
                    shape: vec![rows],
                    data: vec![0; rows * 8],
                },
            ],
            ragged: None,
            permit: None,
            unstacked: None,
        }
    }

    /// What each image normalized on its own gives, as the fused operator writes it.
    fn per_image(b: &Batch, layout: Layout) -> Vec<u8> {
        let t = &b.tensors[0];
        let [_, h, w, _] = t.shape[..] else { unreachable!() };
        let mut out = Vec::new();
        for pixels in t.data.chunks_exact(h * w * 3) {
            normalize_into(pixels, w, &lut(MEAN, STD), layout, false, &mut out);
        }
        bytemuck::cast_slice(&out).to_vec()
    }

    #[test]
    fn a_batch_gets_the_bits_of_its_images_normalized_one_by_one_with_any_thread_count() {
        for layout in [Layout::Hwc, Layout::Chw] {
            for threads in [1, 2, 3, 8] {
                for rows in [1, 17, 40] {
                    let mut b = batch(rows, 5, 7);
                    let expected = per_image(&b, layout);
                    let label = b.tensors[1].clone();
                    Finish::new("image", MEAN, STD, layout, threads).apply(&mut b).unwrap();
                    let t = &b.tensors[0];
                    assert_eq!(t.dtype, DType::Float32);
                    let shape = if layout == Layout::Chw { vec![rows, 3, 5, 7] } else { vec![rows, 5, 7, 3] };
                    assert_eq!(t.shape, shape);
                    assert_eq!(t.data, expected, "{layout:?}, {threads} threads, {rows} rows");
                    assert_eq!(b.tensors[1], label, "other fields are left alone");
                }
            }
        }
    }

    /// `b`'s rows as elements, stacked again by a builder that leaves `image` unstacked.
    fn rebuilt_unstacked(b: &Batch) -> Batch {
        let t = &b.tensors[0];
        let [rows, h, w, 3] = t.shape[..] else { unreachable!() };
        let mut builder = BatchBuilder::new(rows).leaving_unstacked(Some("image".into()));
        for (i, pixels) in t.data.chunks_exact(h * w * 3).enumerate() {
            let mut e = Element::new(&b.keys[i]);
            e.set(
                "image",
                Value::Tensor(Tensor::new(vec![h, w, 3], TensorData::U8(pixels.to_vec().into())).unwrap()),
            );
            e.set("label", Value::Tensor(Tensor::scalar_i64(0)));
            builder.push(e).unwrap();
        }
        builder.finish(0, None)
    }

    #[test]
    fn images_left_in_their_elements_buffers_give_the_same_bits() {
        for layout in [Layout::Hwc, Layout::Chw] {
            for threads in [1, 2, 3] {
                for rows in [1, 17, 40] {
                    let mut stacked = batch(rows, 5, 7);
                    let mut unstacked = rebuilt_unstacked(&stacked);
                    assert!(unstacked.unstacked.is_some() && unstacked.tensors[0].data.is_empty());
                    assert_eq!(unstacked.nbytes(), stacked.nbytes(), "the budget counts the rows");
                    let finish = Finish::new("image", MEAN, STD, layout, threads);
                    finish.apply(&mut stacked).unwrap();
                    finish.apply(&mut unstacked).unwrap();
                    assert!(unstacked.unstacked.is_none(), "it comes out stacked");
                    assert_eq!(unstacked, stacked, "{layout:?}, {threads} threads, {rows} rows");
                }
            }
        }
    }

    #[test]
    fn unstacked_rows_of_the_wrong_length_are_an_error_naming_them() {
        let mut b = rebuilt_unstacked(&batch(3, 2, 2));
        if let Some(u) = b.unstacked.as_mut() {
            u.rows[1].pop();
        }
        let why = Finish::new("image", MEAN, STD, Layout::Chw, 1).apply(&mut b).unwrap_err();
        assert!(why.contains("field `image`") && why.contains("3 rows of 11–12 bytes"), "{why}");
    }

    #[test]
    fn a_batch_without_the_field_is_stacked_and_left_alone() {
        let mut b = rebuilt_unstacked(&batch(2, 3, 4));
        let pixels = batch(2, 3, 4).tensors[0].data.clone();
        Finish::new("pixels", MEAN, STD, Layout::Chw, 1).apply(&mut b).unwrap();
        assert!(b.unstacked.is_none());
        assert_eq!((b.tensors[0].dtype, &b.tensors[0].data), (DType::Uint8, &pixels));
    }

    #[test]
    fn the_path_through_a_scratch_image_gives_the_same_bytes() {
        for layout in [Layout::Hwc, Layout::Chw] {
            let b = batch(3, 5, 7);
            let mut out = Vec::new();
            let images: Vec<&[u8]> = b.tensors[0].data.chunks(5 * 7 * 3).collect();
            Finish::new("image", MEAN, STD, layout, 1).appended(&images, 7, &mut out);
            assert_eq!(out, per_image(&b, layout), "{layout:?}");
        }
    }

    #[test]
    fn a_field_of_another_form_is_an_error_naming_it() {
        let mut b = batch(2, 3, 4);
        b.tensors[0].dtype = DType::Float32;
        b.tensors[0].data = vec![0; 2 * 3 * 4 * 3 * 4];
        let why = Finish::new("image", MEAN, STD, Layout::Chw, 1).apply(&mut b).unwrap_err();
        assert!(why.contains("field `image`") && why.contains("float32"), "{why}");
        let mut b = batch(2, 3, 4);
        b.tensors[0].shape = vec![2, 36];
        assert!(Finish::new("image", MEAN, STD, Layout::Chw, 1).apply(&mut b).is_err());
        let mut b = batch(2, 3, 4);
        assert!(Finish::new("pixels", MEAN, STD, Layout::Chw, 1).apply(&mut b).is_ok(), "no such field");
        assert_eq!(b.tensors[0].dtype, DType::Uint8);
    }
}
