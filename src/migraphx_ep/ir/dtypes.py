"""Element types: MIGraphX's shape::type_t, with numpy and ONNX mappings in one table."""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import ml_dtypes
import numpy as np


class DType(IntEnum):
    """Mirrors MIGraphX's ``shape::type_t`` numbering so ``shape.type()`` matches the real API."""

    bool_type = 0
    half_type = 1
    float_type = 2
    double_type = 3
    uint8_type = 4
    int8_type = 5
    uint16_type = 6
    int16_type = 7
    int32_type = 8
    int64_type = 9
    uint32_type = 10
    uint64_type = 11
    fp8e4m3fnuz_type = 12
    fp8e4m3fn_type = 13
    fp8e5m2_type = 14
    bf16_type = 15
    fp8e5m2fnuz_type = 16
    tuple_type = 100


# (DType, numpy dtype, ONNX TensorProto elem type, C++ name used by generated kernels)
_TABLE: list[tuple[DType, np.dtype, int, str]] = [
    (DType.bool_type, np.dtype(np.bool_), 9, "bool"),
    (DType.half_type, np.dtype(np.float16), 10, "__half"),
    (DType.float_type, np.dtype(np.float32), 1, "float"),
    (DType.double_type, np.dtype(np.float64), 11, "double"),
    (DType.uint8_type, np.dtype(np.uint8), 2, "uint8_t"),
    (DType.int8_type, np.dtype(np.int8), 3, "int8_t"),
    (DType.uint16_type, np.dtype(np.uint16), 4, "uint16_t"),
    (DType.int16_type, np.dtype(np.int16), 5, "int16_t"),
    (DType.int32_type, np.dtype(np.int32), 6, "int32_t"),
    (DType.int64_type, np.dtype(np.int64), 7, "int64_t"),
    (DType.uint32_type, np.dtype(np.uint32), 12, "uint32_t"),
    (DType.uint64_type, np.dtype(np.uint64), 13, "uint64_t"),
    (DType.fp8e4m3fnuz_type, np.dtype(ml_dtypes.float8_e4m3fnuz), 18, "fp8e4m3fnuz"),
    (DType.fp8e4m3fn_type, np.dtype(ml_dtypes.float8_e4m3fn), 17, "fp8e4m3fn"),
    (DType.fp8e5m2_type, np.dtype(ml_dtypes.float8_e5m2), 19, "fp8e5m2"),
    (DType.bf16_type, np.dtype(ml_dtypes.bfloat16), 16, "__nv_bfloat16"),
    (DType.fp8e5m2fnuz_type, np.dtype(ml_dtypes.float8_e5m2fnuz), 20, "fp8e5m2fnuz"),
]

_TO_NUMPY = {t: d for t, d, _, _ in _TABLE}
_FROM_NUMPY = {d: t for t, d, _, _ in _TABLE}
_FROM_ONNX = {o: t for t, _, o, _ in _TABLE}
_TO_ONNX = {t: o for t, _, o, _ in _TABLE}
_TO_CPP = {t: c for t, _, _, c in _TABLE}

FLOAT_TYPES = frozenset(
    {
        DType.half_type,
        DType.float_type,
        DType.double_type,
        DType.bf16_type,
        DType.fp8e4m3fnuz_type,
        DType.fp8e4m3fn_type,
        DType.fp8e5m2_type,
        DType.fp8e5m2fnuz_type,
    }
)
SIGNED_INT_TYPES = frozenset({DType.int8_type, DType.int16_type, DType.int32_type, DType.int64_type})
UNSIGNED_INT_TYPES = frozenset({DType.uint8_type, DType.uint16_type, DType.uint32_type, DType.uint64_type})
INT_TYPES = SIGNED_INT_TYPES | UNSIGNED_INT_TYPES


class UnsupportedTypeError(TypeError):
    """An element type this compiler cannot represent (strings, complex, 4-bit...)."""


def as_dtype(t: DType | int) -> DType:
    """``DType(t)``, without EnumType.__call__'s cost when ``t`` is one already (shapes and kernel
    generators ask this tens of thousands of times per compile)."""
    return t if t.__class__ is DType else DType(t)  # type: ignore[return-value]


def to_numpy(t: DType) -> np.dtype:
    return _TO_NUMPY[as_dtype(t)]


def from_numpy(d: np.dtype | type) -> DType:
    try:
        return _FROM_NUMPY[np.dtype(d)]
    except (KeyError, TypeError):
        raise UnsupportedTypeError(f"unsupported numpy dtype {d!r}") from None


def from_onnx(elem_type: int) -> DType:
    try:
        return _FROM_ONNX[int(elem_type)]
    except KeyError:
        raise UnsupportedTypeError(f"unsupported ONNX element type {elem_type}") from None


def to_onnx(t: DType) -> int:
    return _TO_ONNX[as_dtype(t)]


def to_cpp(t: DType) -> str:
    return _TO_CPP[as_dtype(t)]


def is_float(t: DType) -> bool:
    return t in FLOAT_TYPES


def is_integer(t: DType) -> bool:
    return t in INT_TYPES


def type_name(t: DType) -> str:
    return as_dtype(t).name


def strided_view(
    a: np.ndarray, shape: Sequence[int], strides: Sequence[int], writeable: bool = True
) -> np.ndarray:
    """numpy's ``as_strided`` (``strides`` in bytes) for any element type. ml_dtypes' float8_e5m2 reports
    the array-interface typestr ``<f1``, which ``as_strided`` cannot read back (a TypeError), so the view
    is taken over unsigned integers of the element's width and then given the element type again."""
    raw = a.view(np.dtype(f"u{a.dtype.itemsize}"))
    view = np.lib.stride_tricks.as_strided(raw, tuple(shape), tuple(strides), writeable=writeable)
    return view.view(a.dtype)
