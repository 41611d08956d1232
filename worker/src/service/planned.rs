//! Planned image rows on the wire: a task whose images its consumers make
//! (`Lease.images_on_client`) gives batches whose image field holds one row of bytes per image,
//! ragged as `spec.batch.pad`'s fields are (see `crate::ops::image::planning`). The router
//! cuts them into parts like any ragged field; here each part's field becomes the tensor its
//! consumer makes (`Tensor.images`).

use crate::executor::PlannedOutput;
use granary_proto::v1::{ImageRows, Tensor};

/// Marks the planned rows among `tensors` (the field, carried ragged) for the consumer to make:
/// their lengths move to `images`, and the shape and dtype become the images'. Returns the
/// rows marked (the planned images, and any made here beside them).
pub(crate) fn to_wire(tensors: &mut [Tensor], output: &PlannedOutput) -> u64 {
    let mut images = 0;
    for tensor in tensors.iter_mut().filter(|t| t.name == output.field) {
        let Some(padding) = tensor.padding.take() else { continue };
        let rows = padding.lengths.len() as u64;
        tensor.shape = vec![rows, output.height as u64, output.width as u64, 3];
        tensor.dtype = "uint8".to_string();
        tensor.images = Some(ImageRows { lengths: padding.lengths });
        images += rows;
    }
    images
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::v1::Padding;

    #[test]
    fn ragged_rows_of_the_field_become_image_rows() {
        let output = PlannedOutput { field: "image".into(), height: 4, width: 5 };
        let ragged = Tensor {
            name: "image".into(),
            dtype: "uint8".into(),
            shape: vec![2, 9],
            data: vec![1; 14].into(),
            padding: Some(Padding { lengths: vec![9, 5], ..Default::default() }),
            ..Default::default()
        };
        let label =
            Tensor { name: "label".into(), dtype: "int64".into(), shape: vec![2], ..Default::default() };
        let mut tensors = vec![ragged, label.clone()];
        assert_eq!(to_wire(&mut tensors, &output), 2);
        assert_eq!(tensors[0].shape, [2, 4, 5, 3]);
        assert_eq!(tensors[0].padding, None);
        assert_eq!(tensors[0].images, Some(ImageRows { lengths: vec![9, 5] }));
        assert_eq!(tensors[1], label);
        // Pixels (a task that made its images) stay as they are.
        let mut pixels = vec![Tensor { name: "image".into(), shape: vec![1, 4, 5, 3], ..Default::default() }];
        let before = pixels.clone();
        assert_eq!(to_wire(&mut pixels, &output), 0);
        assert_eq!(pixels, before);
    }
}
