"""Received tensors as NumPy arrays, without copying."""

from __future__ import annotations

from typing import Any

import numpy as np

# Wire dtype names (little-endian) to NumPy dtypes. `bfloat16` has no NumPy dtype of its own:
# it maps to ml_dtypes' (which JAX ships) when that package is installed.
_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "float16",
        "uint32",
        "int32",
        "float32",
        "uint64",
        "int64",
        "float64",
    )
}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The NumPy dtype of a wire dtype name."""
    dtype = _DTYPES.get(name)
    if dtype is not None:
        return dtype
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as error:
            raise TypeError(
                "the pipeline sends bfloat16 tensors: install ml_dtypes (it comes with JAX) "
                "to receive them as NumPy arrays"
            ) from error
        dtype = np.dtype(ml_dtypes.bfloat16)
        _DTYPES[name] = dtype
        return dtype
    raise TypeError(f"the pipeline sent a tensor of dtype {name!r}, which this client cannot map")


def to_array(dtype: str, shape: tuple[int, ...], buffer: Any) -> np.ndarray[Any, Any]:
    """A read-only array over `buffer` (no copy): its `base` chain ends at the buffer."""
    return np.frombuffer(buffer, dtype=numpy_dtype(dtype)).reshape(shape)
