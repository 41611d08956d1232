//! Received tensor bytes, exported to Python through the buffer protocol without a copy.

use std::ffi::c_int;

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// The bytes of one received tensor, kept alive for as long as Python holds a view of them.
///
/// It exports a read-only, one-dimensional byte buffer: `numpy.frombuffer(buffer, dtype)` wraps
/// it as an array without copying, and the array keeps the buffer (and so the received bytes)
/// alive. Read-only because the bytes may share an allocation with the rest of the received
/// message.
#[pyclass(module = "granary._native", frozen)]
pub struct TensorBuffer {
    data: Bytes,
}

impl TensorBuffer {
    /// Wraps `data` as is.
    pub fn new(data: Bytes) -> TensorBuffer {
        TensorBuffer { data }
    }
}

#[pymethods]
impl TensorBuffer {
    /// Address of the first byte: the same as the received buffer's, which is how tests check
    /// that no copy was made on the way to NumPy.
    #[getter]
    fn address(&self) -> usize {
        self.data.as_ptr() as usize
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.data.len()
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!("TensorBuffer(nbytes={}, address={:#x})", self.data.len(), self.address())
    }

    /// Fills `view` with a read-only byte view of the data; a request for a writable buffer
    /// fails with `BufferError`.
    ///
    /// # Safety
    /// `view` is the `Py_buffer` CPython passes to `bf_getbuffer`.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        let length = ffi::Py_ssize_t::try_from(slf.data.len())
            .map_err(|_| PyBufferError::new_err("the tensor is too large for a Python buffer"))?;
        let pointer = slf.data.as_ptr().cast_mut().cast();
        // SAFETY: `view` is valid (checked non-null, provided by CPython); the exporter object is
        // `slf`, which the view holds a reference to, so `data` outlives the view; the buffer is
        // read-only, so nothing writes through `pointer`.
        let filled = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), pointer, length, 1, flags) };
        if filled == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}
