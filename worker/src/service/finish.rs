//! The final `float32` `image.normalize` a pipeline's consumers would finish, run on the worker
//! instead when placement says so (`Lease.normalize_on_worker`: the trainers' hosts have no idle
//! CPU for it). The tables are `granary_kernels`' as in the client, so the values are the same
//! bits wherever it runs.

use crate::engine::DeferredNormalize;
use bytes::Bytes;
use granary_kernels::normalize::{Layout, Lut, lut, normalize_batch_into};
use granary_proto::v1::{Normalize, Tensor};

/// A pipeline's deferred normalization: its field, its wire form, and its tables.
pub(crate) struct Deferred {
    field: String,
    message: Normalize,
    table: Box<Lut>,
    layout: Layout,
}

impl Deferred {
    pub(crate) fn new(deferred: &DeferredNormalize) -> Deferred {
        let (layout, name) = match deferred.layout {
            granary_crds::ops::image::Layout::HWC => (Layout::Hwc, "HWC"),
            granary_crds::ops::image::Layout::CHW => (Layout::Chw, "CHW"),
        };
        let message =
            Normalize { mean: deferred.mean.to_vec(), std: deferred.std.to_vec(), layout: name.to_string() };
        Deferred {
            field: deferred.field.clone(),
            message,
            table: Box::new(lut(deferred.mean, deferred.std)),
            layout,
        }
    }

    /// Readies `tensors` of a part for the wire: the field's tensor is normalized here when
    /// `on_worker`, else it is marked for the consumer to finish. Returns the images normalized
    /// here.
    pub(crate) fn apply(&self, tensors: &mut [Tensor], on_worker: bool) -> u64 {
        let mut images = 0;
        for tensor in tensors.iter_mut().filter(|t| t.name == self.field) {
            if on_worker && let Some(done) = self.normalized(tensor) {
                images += done.shape.first().copied().unwrap_or(0);
                *tensor = done;
            } else {
                tensor.normalize = Some(self.message.clone());
            }
        }
        images
    }

    /// `tensor` (`uint8` `[rows, h, w, 3]`) normalized to `float32` in the layout; `None` when
    /// it has another form, which then goes to the consumer marked as before (its checks name
    /// the problem).
    fn normalized(&self, tensor: &Tensor) -> Option<Tensor> {
        let [rows, h, w, 3] = tensor.shape[..] else { return None };
        let [h_px, w_px] = [h, w].map(|d| usize::try_from(d).ok());
        let (h_px, w_px) = (h_px?, w_px?);
        let image = h_px.checked_mul(w_px)?.checked_mul(3)?;
        if tensor.dtype != "uint8"
            || image == 0
            || tensor.data.len() != image.checked_mul(usize::try_from(rows).ok()?)?
        {
            return None;
        }
        let mut out = Vec::new();
        normalize_batch_into(&tensor.data, h_px, w_px, &self.table, self.layout, &mut out);
        let shape = match self.layout {
            Layout::Hwc => vec![rows, h, w, 3],
            Layout::Chw => vec![rows, 3, h, w],
        };
        Some(Tensor {
            name: tensor.name.clone(),
            dtype: "float32".to_string(),
            shape,
            data: floats_to_bytes(out),
            normalize: None,
            padding: tensor.padding.clone(),
            images: None,
        })
    }
}

/// Little-endian `float32` values as bytes, without a copy on little-endian hosts.
fn floats_to_bytes(values: Vec<f32>) -> Bytes {
    #[cfg(target_endian = "little")]
    {
        struct Floats(Vec<f32>);
        impl AsRef<[u8]> for Floats {
            fn as_ref(&self) -> &[u8] {
                bytemuck::cast_slice(&self.0)
            }
        }
        Bytes::from_owner(Floats(values))
    }
    #[cfg(not(target_endian = "little"))]
    {
        Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_kernels::normalize::normalize_into;

    fn deferred(layout: granary_crds::ops::image::Layout) -> Deferred {
        Deferred::new(&DeferredNormalize {
            field: "image".into(),
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
            layout,
        })
    }

    fn pixels(rows: u64, h: u64, w: u64) -> Tensor {
        let n = (rows * h * w * 3) as usize;
        Tensor {
            name: "image".into(),
            dtype: "uint8".into(),
            shape: vec![rows, h, w, 3],
            data: Bytes::from((0..n).map(|i| (i as u8).wrapping_mul(37)).collect::<Vec<u8>>()),
            normalize: None,
            padding: None,
            images: None,
        }
    }

    #[test]
    fn on_the_worker_the_field_is_normalized_with_the_kernels_tables_and_others_are_left() {
        for (layout, shape) in [
            (granary_crds::ops::image::Layout::HWC, vec![2, 3, 5, 3]),
            (granary_crds::ops::image::Layout::CHW, vec![2, 3, 3, 5]),
        ] {
            let d = deferred(layout);
            let label =
                Tensor { name: "label".into(), dtype: "int64".into(), shape: vec![2], ..Default::default() };
            let mut tensors = vec![pixels(2, 3, 5), label.clone()];
            let source = tensors[0].data.clone();
            assert_eq!(d.apply(&mut tensors, true), 2, "two images normalized");
            assert_eq!((tensors[0].dtype.as_str(), &tensors[0].shape), ("float32", &shape));
            assert_eq!(tensors[0].normalize, None);
            assert_eq!(tensors[1], label, "other fields pass as they are");
            let mut expected = Vec::new();
            for image in source.chunks_exact(45) {
                normalize_into(image, 5, &d.table, d.layout, false, &mut expected);
            }
            assert_eq!(&tensors[0].data[..], bytemuck::cast_slice::<f32, u8>(&expected));
        }
    }

    #[test]
    fn left_to_the_consumer_the_field_is_marked_and_not_touched() {
        let d = deferred(granary_crds::ops::image::Layout::CHW);
        let mut tensors = vec![pixels(1, 2, 2)];
        let before = tensors[0].data.clone();
        assert_eq!(d.apply(&mut tensors, false), 0);
        assert_eq!(tensors[0].data, before);
        assert_eq!(tensors[0].normalize.as_ref().map(|n| n.layout.as_str()), Some("CHW"));
        // A tensor of another form is left to the consumer's checks, even on the worker.
        let mut odd = vec![Tensor { shape: vec![1, 2, 2], ..pixels(1, 2, 2) }];
        assert_eq!(d.apply(&mut odd, true), 0);
        assert_eq!(odd[0].dtype, "uint8");
        assert!(odd[0].normalize.is_some());
    }
}
