"""Reductions (MIGraphX ``reduce_*``, ``argmax``/``argmin``, ``prefix_scan_sum``/``_prod``).

Like MIGraphX, reductions keep the reduced axes as length 1; the frontend squeezes for keepdims=0.
Sums of narrow floats accumulate in float32 and round once (ORT's CPU kernels do the same), integer
sums wrap in their own type, and an empty reduction gives the identity of the operation.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .base import NUMERIC_TYPES
from .pointwise import NARROW_FLOATS

_ORDERED = NUMERIC_TYPES | {DType.bool_type}


def _normalize_axes(axes: tuple[int, ...], rank: int, op: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"{op}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axes {list(axes)}")
    return tuple(sorted(out))


def _acc_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt in NARROW_FLOATS else dt


@op_class
class ReduceOp(Op):
    """Reduce over ``axes`` keeping them as 1s; subclasses give ``reduce(x, axes)`` (keepdims=True)."""

    axes: tuple[int, ...] = ()
    types: ClassVar[frozenset[DType]] = frozenset(NUMERIC_TYPES)

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(self.types)
        s = inputs[0]
        axes = _normalize_axes(self.axes, s.ndim(), self.name)
        return s.with_lens([1 if i in axes else n for i, n in enumerate(s.lens)])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        axes = _normalize_axes(self.axes, x.ndim, self.name)
        with np.errstate(all="ignore"):
            r = self.reduce(x, axes) if axes else x
        return np.asarray(r).astype(out.dtype, copy=False).reshape(out.lens)

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError


@register_op
@op_class
class ReduceSum(ReduceOp):
    name: ClassVar[str] = "reduce_sum"

    def reduce(self, x, axes):
        return np.sum(x, axis=axes, dtype=_acc_dtype(x.dtype), keepdims=True)


@register_op
@op_class
class ReduceMean(ReduceOp):
    name: ClassVar[str] = "reduce_mean"

    def reduce(self, x, axes):
        n = int(np.prod([x.shape[a] for a in axes]))
        s = np.sum(x, axis=axes, dtype=_acc_dtype(x.dtype), keepdims=True)
        if x.dtype.kind in "iu":
            # ORT divides the (wrapping) integer sum by the count: truncation toward zero.
            q = np.floor_divide(s, max(n, 1))
            return q + ((s - q * n != 0) & (s < 0)).astype(q.dtype)
        return s / s.dtype.type(n)  # 0/0: an empty mean is NaN


@register_op
@op_class
class ReduceProd(ReduceOp):
    name: ClassVar[str] = "reduce_prod"

    def reduce(self, x, axes):
        return np.prod(x, axis=axes, dtype=_acc_dtype(x.dtype), keepdims=True)


def _lowest(dt: np.dtype):
    if dt.kind == "b":
        return False
    return -np.inf if dt.kind == "f" or dt in NARROW_FLOATS else np.iinfo(dt).min


def _highest(dt: np.dtype):
    if dt.kind == "b":
        return True
    return np.inf if dt.kind == "f" or dt in NARROW_FLOATS else np.iinfo(dt).max


# NaN rule of reduce_max/min and argmax/argmin: a NaN is skipped (np.fmax); only NaN gives NaN (index
# 0 for arg*). ONNX says nothing; ORT's CPU kernels compare with ">" and so skip NaN too, except that a
# NaN first along the axis wins there (their scan starts from it): a quirk no parallel reduction repeats.
def _skip_nan(ufunc: np.ufunc, x: np.ndarray, axes: tuple[int, ...], empty) -> np.ndarray:
    x = _acc(x)
    if x.size == 0:  # an empty reduction is the identity (-inf for max)
        return np.full([1 if i in axes else n for i, n in enumerate(x.shape)], empty, x.dtype)
    return ufunc.reduce(x, axis=axes, keepdims=True)


@register_op
@op_class
class ReduceMax(ReduceOp):
    """Max skipping NaN (see ``_skip_nan``); an empty reduction gives the lowest value (-inf for floats)."""

    name: ClassVar[str] = "reduce_max"
    types: ClassVar[frozenset[DType]] = frozenset(_ORDERED)

    def reduce(self, x, axes):
        return _skip_nan(np.fmax, x, axes, _lowest(x.dtype))


@register_op
@op_class
class ReduceMin(ReduceOp):
    name: ClassVar[str] = "reduce_min"
    types: ClassVar[frozenset[DType]] = frozenset(_ORDERED)

    def reduce(self, x, axes):
        return _skip_nan(np.fmin, x, axes, _highest(x.dtype))


def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in NARROW_FLOATS else x


@op_class
class ArgOp(Op):
    """Index (int64) of the max/min along ``axis``, kept as a length-1 axis; first or last on ties; NaN
    is skipped (``_skip_nan``)."""

    axis: int = 0
    select_last_index: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(NUMERIC_TYPES | {DType.bool_type})
        s = inputs[0]
        (ax,) = _normalize_axes((self.axis,), s.ndim(), self.name)
        if s.lens[ax] == 0:
            raise ShapeError(f"{self.name}: axis {ax} has length 0")
        return Shape(DType.int64_type, [1 if i == ax else n for i, n in enumerate(s.lens)])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        (ax,) = _normalize_axes((self.axis,), x.ndim, self.name)
        ufunc = np.fmax if self.name == "argmax" else np.fmin
        hit = _acc(x) == _skip_nan(ufunc, x, (ax,), 0)  # NaN equals nothing: it is never picked
        if self.select_last_index:
            r = x.shape[ax] - 1 - np.argmax(np.flip(hit, ax), axis=ax, keepdims=True)
        else:
            r = np.argmax(hit, axis=ax, keepdims=True)
        return np.where(hit.any(axis=ax, keepdims=True), r, 0).astype(np.int64)  # all NaN: index 0


@register_op
@op_class
class Argmax(ArgOp):
    name: ClassVar[str] = "argmax"


@register_op
@op_class
class Argmin(ArgOp):
    name: ClassVar[str] = "argmin"


@op_class
class PrefixScanOp(Op):
    """Cumulative ``ufunc`` along ``axis`` (ONNX CumSum/CumProd), optionally exclusive and/or reversed.

    MIGraphX's ``prefix_scan_op`` base: subclasses give only the ufunc. An exclusive scan starts from
    the ufunc's identity; narrow floats accumulate in float32 and round once (as ORT's CPU kernels do).
    """

    ufunc: ClassVar[np.ufunc]
    axis: int = 0
    exclusive: bool = False
    reverse: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(NUMERIC_TYPES).min_ndims(1)
        _normalize_axes((self.axis,), inputs[0].ndim(), self.name)
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        (ax,) = _normalize_axes((self.axis,), x.ndim, self.name)
        if self.reverse:
            x = np.flip(x, ax)
        with np.errstate(all="ignore"):
            r = type(self).ufunc.accumulate(x, axis=ax, dtype=_acc_dtype(x.dtype))
        if self.exclusive:
            shifted = np.full_like(r, type(self).ufunc.identity)
            head, tail = [slice(None)] * r.ndim, [slice(None)] * r.ndim
            head[ax], tail[ax] = slice(1, None), slice(None, -1)
            shifted[tuple(head)] = r[tuple(tail)]
            r = shifted
        if self.reverse:
            r = np.flip(r, ax)
        return np.ascontiguousarray(r).astype(out.dtype, copy=False)


@register_op
@op_class
class PrefixScanSum(PrefixScanOp):
    name: ClassVar[str] = "prefix_scan_sum"
    ufunc: ClassVar[np.ufunc] = np.add


@register_op
@op_class
class PrefixScanProd(PrefixScanOp):
    name: ClassVar[str] = "prefix_scan_prod"
    ufunc: ClassVar[np.ufunc] = np.multiply
