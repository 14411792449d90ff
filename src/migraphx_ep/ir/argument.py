"""Arguments: a shape plus the buffer holding its data (MIGraphX ``argument``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import from_numpy
from .shape import Shape


class Argument:
    """Wraps a numpy array; views (transposes, broadcasts) keep their strides in the shape."""

    __slots__ = ("_data", "_shape")

    def __init__(self, data: Any = None, shape: Shape | None = None) -> None:
        if data is None and shape is not None:
            data = np.zeros(shape.lens, dtype=shape.dtype)
        arr = data._data if isinstance(data, Argument) else np.asarray(data)
        if not arr.flags.c_contiguous and shape is None:
            # A foreign buffer's byte strides may not be element multiples; keep a clean copy.
            arr = np.ascontiguousarray(arr)
        self._data = arr
        if shape is None:
            t = from_numpy(arr.dtype)
            item = arr.dtype.itemsize
            strides = [s // item for s in arr.strides] if arr.ndim else []
            shape = Shape(t, arr.shape, strides)
        elif tuple(arr.shape) != shape.lens:
            raise ValueError(f"argument: data dims {list(arr.shape)} do not match shape {shape}")
        self._shape = shape

    def get_shape(self) -> Shape:
        return self._shape

    def data_ptr(self) -> int:
        return int(self._data.__array_interface__["data"][0])

    def tolist(self) -> list:
        return np.asarray(self._data).ravel().tolist()

    def numpy(self) -> np.ndarray:
        return self._data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._data if dtype is None else self._data.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Argument):
            return NotImplemented
        return self._shape.lens == other._shape.lens and bool(np.array_equal(self._data, other._data))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"argument({self._shape}: {self._data!r})"
