"""Data movement ops: concat, gathers, scatters, pad, reverse, topk, onehot, trilu, reverse_sequence.

Index inputs follow ONNX: negative indices count from the end; an index out of range is a run-time
error (never a silent read or write of another element).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes, follow_channels_last

INDEX_TYPES = frozenset({DType.int32_type, DType.int64_type})
REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_indices(idx: np.ndarray, dim: int | np.ndarray, op: str) -> np.ndarray:
    """ONNX index semantics: [-dim, dim) with negatives from the end; anything else is an error."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if np.any(bad):
        raise IndexError(f"{op}: index {int(idx[bad].ravel()[0])} out of range for dimension size(s) {dim}")
    return np.where(idx < 0, idx + dim, idx)


@register_op
@op_class
class Concat(Op):
    name: ClassVar[str] = "concat"
    axis: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has_at_least(1).same_type().same_ndims()
        s = inputs[0]
        a = _axis(self.axis, s.ndim(), self.name)
        for x in inputs[1:]:
            if x.lens[:a] + x.lens[a + 1 :] != s.lens[:a] + s.lens[a + 1 :]:
                raise ShapeError(f"concat: dims {[list(i.lens) for i in inputs]} differ off axis {a}")
        lens = list(s.lens)
        lens[a] = sum(x.lens[a] for x in inputs)
        return Shape(s.type, lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(args, axis=_axis(self.axis, out.ndim(), self.name))


@register_op
@op_class
class Gather(Op):
    name: ClassVar[str] = "gather"
    axis: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2)
        d, i = inputs
        check_shapes(self.name, [i]).types(INDEX_TYPES)
        a = _axis(self.axis, d.ndim(), self.name)
        return Shape(d.type, d.lens[:a] + i.lens + d.lens[a + 1 :])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        data, idx = args
        a = _axis(self.axis, data.ndim, self.name)
        return np.take(data, normalize_indices(idx, data.shape[a], self.name), axis=a)


@register_op
@op_class
class GatherElements(Op):
    name: ClassVar[str] = "gather_elements"
    axis: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_ndims()
        d, i = inputs
        check_shapes(self.name, [i]).types(INDEX_TYPES)
        _axis(self.axis, d.ndim(), self.name)
        return Shape(d.type, i.lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        data, idx = args
        a = _axis(self.axis, data.ndim, self.name)
        return np.take_along_axis(data, normalize_indices(idx, data.shape[a], self.name), axis=a)


def _nd_index(data_lens: Sequence[int], idx: np.ndarray, batch_dims: int, op: str) -> tuple:
    """Index tuple into ``data`` reshaped to (batch, *rest) for ONNX GatherND/ScatterND indices."""
    k = idx.shape[-1]
    lens = np.asarray(data_lens[batch_dims : batch_dims + k], dtype=np.int64)
    batch = int(np.prod(data_lens[:batch_dims], dtype=np.int64))
    idx = normalize_indices(idx.reshape(batch, -1, k), lens, op)
    b = np.arange(batch).reshape(batch, 1)
    return (b,) + tuple(idx[..., j] for j in range(k))


def _nd_check(d: Shape, i: Shape, batch_dims: int, op: str) -> int:
    check_shapes(op, [i]).types(INDEX_TYPES)
    if i.ndim() < 1 or batch_dims < 0 or batch_dims >= min(d.ndim(), i.ndim()):
        raise ShapeError(f"{op}: batch_dims {batch_dims} invalid for ranks {d.ndim()}, {i.ndim()}")
    if d.lens[:batch_dims] != i.lens[:batch_dims]:
        raise ShapeError(f"{op}: batch dims of {list(d.lens)} and {list(i.lens)} differ")
    k = i.lens[-1]
    if k > d.ndim() - batch_dims:
        raise ShapeError(f"{op}: index depth {k} exceeds data rank {d.ndim()} - batch_dims")
    return k


@register_op
@op_class
class Gathernd(Op):
    name: ClassVar[str] = "gathernd"
    batch_dims: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2)
        d, i = inputs
        k = _nd_check(d, i, self.batch_dims, self.name)
        return Shape(d.type, i.lens[:-1] + d.lens[self.batch_dims + k :])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        data, idx = args
        b = self.batch_dims
        flat = data.reshape((-1,) + data.shape[b:])
        return flat[_nd_index(data.shape, idx, b, self.name)].reshape(out.lens)


@op_class
class _ScatterBase(Op):
    reduction: ClassVar[str] = "none"

    def _apply(self, data: np.ndarray, index: tuple, updates: np.ndarray) -> np.ndarray:
        out = np.array(data, copy=True)
        fn = REDUCTIONS[self.reduction]
        if fn is None:
            # ONNX leaves duplicate indices undefined here; like ORT, later updates win.
            out[index] = updates
        else:
            fn.at(out, index, updates)  # unbuffered: duplicates accumulate, as ONNX requires
        return out


@op_class
class _ScatterElements(_ScatterBase):
    axis: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(3).same_ndims()
        d, i, u = inputs
        check_shapes(self.name, [i]).types(INDEX_TYPES)
        if i.lens != u.lens or u.type != d.type:
            raise ShapeError(f"{self.name}: indices {i} and updates {u} must match (updates of data's type)")
        _axis(self.axis, d.ndim(), self.name)
        return d.as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        data, idx, upd = args
        a = _axis(self.axis, data.ndim, self.name)
        full = list(np.indices(idx.shape, sparse=True))
        full[a] = normalize_indices(idx, data.shape[a], self.name)
        return self._apply(data, tuple(full), upd)


@op_class
class _ScatterND(_ScatterBase):
    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(3)
        d, i, u = inputs
        k = _nd_check(d, i, 0, self.name)
        if u.lens != i.lens[:-1] + d.lens[k:] or u.type != d.type:
            raise ShapeError(f"{self.name}: updates {u} do not fit data {d} and indices {i}")
        return d.as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        data, idx, upd = args
        k = idx.shape[-1]
        index = _nd_index(data.shape, idx, 0, self.name)[1:]
        return self._apply(data, index, upd.reshape((-1,) + data.shape[k:]) if index else upd)


for _red in REDUCTIONS:
    for _base, _prefix in ((_ScatterElements, "scatter"), (_ScatterND, "scatternd")):
        register_op(
            op_class(
                type(
                    f"{_prefix.title()}{_red.title()}",
                    (_base,),
                    {"__annotations__": {}, "name": f"{_prefix}_{_red}", "reduction": _red},
                )
            )
        )


@register_op
@op_class
class Pad(Op):
    """``pads`` = begins then ends per axis; negative pads crop (constant mode only)."""

    name: ClassVar[str] = "pad"
    pads: tuple[int, ...] = ()
    mode: str = "constant"  # constant | reflect | edge | wrap
    value: float = 0.0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        r = s.ndim()
        if len(self.pads) != 2 * r or self.mode not in ("constant", "reflect", "edge", "wrap"):
            raise ShapeError(f"pad: bad pads {list(self.pads)} or mode {self.mode!r} for rank {r}")
        lens = [n + self.pads[i] + self.pads[i + r] for i, n in enumerate(s.lens)]
        if any(n < 0 for n in lens):
            raise ShapeError(f"pad: pads {list(self.pads)} crop {list(s.lens)} below zero")
        if self.mode != "constant":
            for i, n in enumerate(s.lens):
                lo, hi = self.pads[i], self.pads[i + r]
                if min(lo, hi) < 0:
                    raise ShapeError(f"pad: negative pads need constant mode, not {self.mode!r}")
                if (lo or hi) and (
                    n == 0
                    or (self.mode == "reflect" and max(lo, hi) >= n)
                    or (self.mode == "wrap" and max(lo, hi) > n)
                ):
                    raise ShapeError(f"pad: {self.mode} pads {lo},{hi} too large for dim {n}")
        return follow_channels_last(Shape(s.type, lens), [s])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        r = x.ndim
        crop = tuple(slice(max(-self.pads[i], 0), x.shape[i] - max(-self.pads[i + r], 0)) for i in range(r))
        width = [(max(self.pads[i], 0), max(self.pads[i + r], 0)) for i in range(r)]
        if self.mode == "constant":
            return np.pad(
                x[crop], width, mode="constant", constant_values=np.asarray(self.value).astype(x.dtype)
            )
        return np.pad(x, width, mode=self.mode)


@register_op
@op_class
class Reverse(Op):
    name: ClassVar[str] = "reverse"
    axes: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        for a in self.axes:
            _axis(a, inputs[0].ndim(), self.name)
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.flip(args[0], axis=tuple(self.axes)) if self.axes else args[0]


@register_op
@op_class
class Topk(Op):
    """(values, int64 indices) of the k largest/smallest along ``axis``; ties keep the lower index first."""

    name: ClassVar[str] = "topk"
    k: int = 1
    axis: int = -1
    largest: bool = True

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        a = _axis(self.axis, s.ndim(), self.name)
        if not 0 <= self.k <= s.lens[a]:
            raise ShapeError(f"topk: k={self.k} out of range for dim {s.lens[a]}")
        lens = list(s.lens)
        lens[a] = self.k
        return Shape.tuple_of([Shape(s.type, lens), Shape(DType.int64_type, lens)])

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:
        x = args[0]
        a = _axis(self.axis, x.ndim, self.name)
        n = x.shape[a]
        if self.largest:
            # Stable ascending sort of the reversed axis, read backwards: descending values with
            # equal values in increasing original index order.
            order = np.flip(np.argsort(np.flip(x, axis=a), axis=a, kind="stable"), axis=a)
            order = n - 1 - order
        else:
            order = np.argsort(x, axis=a, kind="stable")
        idx = np.take(order, np.arange(self.k), axis=a).astype(np.int64)
        return [np.take_along_axis(x, idx, axis=a), idx]


@register_op
@op_class
class Onehot(Op):
    """Inputs: indices (any numeric; truncated to int) and values [off, on]; ``axis`` in the output."""

    name: ClassVar[str] = "onehot"
    depth: int = 1
    axis: int = -1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2)
        i, v = inputs
        if v.elements() != 2 or self.depth < 0:
            raise ShapeError(f"onehot: values must hold [off, on], depth {self.depth} must be >= 0")
        lens = list(i.lens)
        lens.insert(_axis(self.axis, i.ndim() + 1, self.name), self.depth)
        return Shape(v.type, lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        idx, values = args
        with np.errstate(invalid="ignore"):
            i = idx.astype(np.int64)
        i = np.where(i < 0, i + self.depth, i)
        hot = i[..., None] == np.arange(self.depth)  # out-of-range indices match nothing: all "off"
        hot = np.moveaxis(hot, -1, _axis(self.axis, idx.ndim + 1, self.name))
        off, on = values.ravel()
        return np.where(hot, on, off).astype(out.dtype)


@register_op
@op_class
class Trilu(Op):
    name: ClassVar[str] = "trilu"
    upper: bool = True
    k: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).min_ndims(2)
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        return np.triu(x, self.k) if self.upper else np.tril(x, self.k)


@register_op
@op_class
class ReverseSequence(Op):
    """Reverse the first ``seq_lens[b]`` steps along ``time_axis`` for each batch ``b``."""

    name: ClassVar[str] = "reverse_sequence"
    batch_axis: int = 1
    time_axis: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2)
        x, sl = inputs
        check_shapes(self.name, [sl]).types({DType.int64_type}).ndims(1)
        if (
            x.ndim() < 2
            or {self.batch_axis, self.time_axis} != {0, 1}
            or sl.lens[0] != x.lens[self.batch_axis]
        ):
            raise ShapeError(f"reverse_sequence: bad axes or sequence_lens for {x}")
        return x.as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, lens = args
        t = x.shape[self.time_axis]
        if np.any((lens < 0) | (lens > t)):
            raise IndexError(f"reverse_sequence: sequence_lens {lens.tolist()} outside [0, {t}]")
        xt = np.moveaxis(x, (self.batch_axis, self.time_axis), (0, 1))
        res = np.array(xt, copy=True)
        for b, n in enumerate(lens.tolist()):
            res[b, :n] = xt[b, :n][::-1]
        return np.moveaxis(res, (0, 1), (self.batch_axis, self.time_axis))
