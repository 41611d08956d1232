//! Dense tensors: typed storage plus a shape.

pub use granary_crds::DType;
pub use smallvec::SmallVec;
use smallvec::smallvec;

/// Typed, contiguous storage of a tensor's elements in row-major order.
///
/// Up to 16 bytes of elements (a scalar, a short vector) are held inline, in the 24 bytes a `Vec`
/// takes, so a table's cells allocate nothing; larger tensors are on the heap, and moving a `Vec`
/// in or out ([`SmallVec::from_vec`], [`SmallVec::into_vec`]) copies nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `uint8`
    U8(SmallVec<[u8; 16]>),
    /// `int32`
    I32(SmallVec<[i32; 4]>),
    /// `int64`
    I64(SmallVec<[i64; 2]>),
    /// `float32`
    F32(SmallVec<[f32; 4]>),
    /// `float64`
    F64(SmallVec<[f64; 2]>),
}

/// A dense tensor: row-major data and its shape (empty shape = scalar).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Extent of each axis.
    pub shape: Vec<usize>,
    /// The elements, `shape.iter().product()` of them.
    pub data: TensorData,
}

impl Tensor {
    /// A tensor from data and shape; `None` when the element count does not match the shape.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Option<Tensor> {
        let t = Tensor { shape, data };
        (t.len() == t.shape.iter().product::<usize>()).then_some(t)
    }

    /// A tensor of `dtype` from its little-endian bytes; `None` when they are not whole values or
    /// not as many as `shape` holds (extents whose product overflows included).
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, raw: &[u8]) -> Option<Tensor> {
        fn cast<A: smallvec::Array<Item: bytemuck::Pod>>(raw: &[u8]) -> Option<SmallVec<A>> {
            let size = std::mem::size_of::<A::Item>();
            if !raw.len().is_multiple_of(size) {
                return None;
            }
            let mut out: SmallVec<A> = smallvec![<A::Item as bytemuck::Zeroable>::zeroed(); raw.len() / size];
            bytemuck::cast_slice_mut::<A::Item, u8>(&mut out).copy_from_slice(raw);
            Some(out)
        }
        shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d))?;
        let data = match dtype {
            DType::Uint8 => TensorData::U8(SmallVec::from_slice(raw)),
            DType::Int32 => TensorData::I32(cast(raw)?),
            DType::Int64 => TensorData::I64(cast(raw)?),
            DType::Float32 => TensorData::F32(cast(raw)?),
            DType::Float64 => TensorData::F64(cast(raw)?),
        };
        Tensor::new(shape, data)
    }

    /// Replaces the elements with `raw` (little-endian, as many bytes as the tensor holds) and
    /// the shape with `shape`, keeping the storage; `false` (and nothing changed) when the sizes
    /// do not match.
    pub fn overwrite_le_bytes(&mut self, shape: Vec<usize>, raw: &[u8]) -> bool {
        let count = shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
        if count != Some(self.len()) || raw.len() != self.nbytes() {
            return false;
        }
        match &mut self.data {
            TensorData::U8(v) => v.copy_from_slice(raw),
            TensorData::I32(v) => bytemuck::cast_slice_mut::<i32, u8>(v).copy_from_slice(raw),
            TensorData::I64(v) => bytemuck::cast_slice_mut::<i64, u8>(v).copy_from_slice(raw),
            TensorData::F32(v) => bytemuck::cast_slice_mut::<f32, u8>(v).copy_from_slice(raw),
            TensorData::F64(v) => bytemuck::cast_slice_mut::<f64, u8>(v).copy_from_slice(raw),
        }
        self.shape = shape;
        true
    }

    /// A scalar `int64`.
    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor { shape: Vec::new(), data: TensorData::I64(smallvec![v]) }
    }

    /// A scalar `float64`.
    pub fn scalar_f64(v: f64) -> Tensor {
        Tensor { shape: Vec::new(), data: TensorData::F64(smallvec![v]) }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::U8(_) => DType::Uint8,
            TensorData::I32(_) => DType::Int32,
            TensorData::I64(_) => DType::Int64,
            TensorData::F32(_) => DType::Float32,
            TensorData::F64(_) => DType::Float64,
        }
    }

    /// Number of elements stored.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::U8(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::F32(v) => v.len(),
            TensorData::F64(v) => v.len(),
        }
    }

    /// True when the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as little-endian bytes (the host is little-endian, so this is a view).
    pub fn as_le_bytes(&self) -> &[u8] {
        match &self.data {
            TensorData::U8(v) => v,
            TensorData::I32(v) => bytemuck::cast_slice(v),
            TensorData::I64(v) => bytemuck::cast_slice(v),
            TensorData::F32(v) => bytemuck::cast_slice(v),
            TensorData::F64(v) => bytemuck::cast_slice(v),
        }
    }

    /// Size of the data in bytes.
    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype().size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_and_short_vectors_are_held_inline_in_the_size_of_a_vec() {
        assert_eq!(size_of::<SmallVec<[u8; 16]>>(), size_of::<Vec<u8>>());
        assert_eq!(size_of::<SmallVec<[f64; 2]>>(), size_of::<Vec<f64>>());
        let TensorData::F64(v) = Tensor::scalar_f64(1.5).data else { panic!("float64") };
        assert!(!v.spilled());
        let four = Tensor::from_le_bytes(DType::Float32, vec![4], &[0; 16]).unwrap();
        let TensorData::F32(v) = &four.data else { panic!("float32") };
        assert!(!v.spilled());
        let five = Tensor::from_le_bytes(DType::Float32, vec![5], &[0; 20]).unwrap();
        let TensorData::F32(v) = &five.data else { panic!("float32") };
        assert!(v.spilled());
        assert_eq!(five.as_le_bytes(), [0; 20]);
    }

    #[test]
    fn a_large_vec_moves_in_and_out_without_a_copy() {
        let image = vec![7u8; 224 * 224 * 3];
        let at = image.as_ptr();
        let data: SmallVec<[u8; 16]> = SmallVec::from_vec(image);
        assert_eq!(data.as_ptr(), at);
        let back = data.into_vec();
        assert_eq!(back.as_ptr(), at);
    }
}
