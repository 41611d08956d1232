//! Dense tensors: typed storage plus a shape.

pub use granary_crds::DType;

/// Typed, contiguous storage of a tensor's elements in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `uint8`
    U8(Vec<u8>),
    /// `int32`
    I32(Vec<i32>),
    /// `int64`
    I64(Vec<i64>),
    /// `float32`
    F32(Vec<f32>),
    /// `float64`
    F64(Vec<f64>),
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
        fn cast<T: bytemuck::Pod>(raw: &[u8]) -> Option<Vec<T>> {
            let size = std::mem::size_of::<T>();
            if !raw.len().is_multiple_of(size) {
                return None;
            }
            let mut out: Vec<T> = vec![T::zeroed(); raw.len() / size];
            bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(raw);
            Some(out)
        }
        shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d))?;
        let data = match dtype {
            DType::Uint8 => TensorData::U8(raw.to_vec()),
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
        Tensor { shape: Vec::new(), data: TensorData::I64(vec![v]) }
    }

    /// A scalar `float64`.
    pub fn scalar_f64(v: f64) -> Tensor {
        Tensor { shape: Vec::new(), data: TensorData::F64(vec![v]) }
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
