"""Ops that reinterpret a buffer: transpose, reshape, squeeze, unsqueeze, flatten, slice, step, broadcast.

Each returns a strided shape and aliases its input (``output_alias`` 0) when the layout allows a view;
``reshape``/``flatten`` of a non-standard input must copy, so they alias only standard inputs.
Slice offsets are not part of ``Shape``: a target applies them to the buffer pointer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes


def _axes(axes: Sequence[int], rank: int, op: str) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"{op}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axes {list(axes)}")
    return out


class _View(Op):
    def output_alias(self, inputs: Sequence[Shape]) -> int:
        return 0


@register_op
@op_class
class Transpose(_View):
    name: ClassVar[str] = "transpose"
    permutation: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if sorted(self.permutation) != list(range(s.ndim())):
            raise ShapeError(f"transpose: {list(self.permutation)} is not a permutation of rank {s.ndim()}")
        return Shape(s.type, [s.lens[p] for p in self.permutation], [s.strides[p] for p in self.permutation])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.transpose(args[0], self.permutation)


@register_op
@op_class
class Reshape(Op):
    """``dims`` may hold one -1 (inferred); 0 is a literal zero here (the parser resolves ONNX's copy-0)."""

    name: ClassVar[str] = "reshape"
    dims: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        dims = list(self.dims)
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise ShapeError(f"reshape: bad dims {dims}")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or s.elements() % known:
                raise ShapeError(f"reshape: cannot infer -1 in {dims} from {list(s.lens)}")
            dims[dims.index(-1)] = s.elements() // known
        if math.prod(dims) != s.elements():
            raise ShapeError(
                f"reshape: {list(s.lens)} has {s.elements()} elements, {dims} needs {math.prod(dims)}"
            )
        return Shape(s.type, dims)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.reshape(args[0], out.lens)

    def output_alias(self, inputs: Sequence[Shape]) -> int:
        return 0 if inputs[0].standard() else -1


@register_op
@op_class
class Flatten(Op):
    name: ClassVar[str] = "flatten"
    axis: int = 1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if not -s.ndim() <= self.axis <= s.ndim():
            raise ShapeError(f"flatten: axis {self.axis} out of range for rank {s.ndim()}")
        a = self.axis + s.ndim() if self.axis < 0 else self.axis
        return Shape(s.type, [math.prod(s.lens[:a]), math.prod(s.lens[a:])])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.reshape(args[0], out.lens)

    def output_alias(self, inputs: Sequence[Shape]) -> int:
        return 0 if inputs[0].standard() else -1


@register_op
@op_class
class Squeeze(_View):
    """Drop ``axes`` (all size-1 axes when empty); each named axis must have size 1."""

    name: ClassVar[str] = "squeeze"
    axes: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        axes = (
            _axes(self.axes, s.ndim(), self.name)
            if self.axes
            else [i for i, n in enumerate(s.lens) if n == 1]
        )
        if any(s.lens[a] != 1 for a in axes):
            raise ShapeError(f"squeeze: axes {list(self.axes)} of {list(s.lens)} are not all 1")
        keep = [i for i in range(s.ndim()) if i not in axes]
        return Shape(s.type, [s.lens[i] for i in keep], [s.strides[i] for i in keep])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.reshape(args[0], out.lens)


@register_op
@op_class
class Unsqueeze(_View):
    """Insert size-1 ``axes`` (positions in the output, negatives counted from the output rank)."""

    name: ClassVar[str] = "unsqueeze"
    axes: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        rank = s.ndim() + len(self.axes)
        axes = set(_axes(self.axes, rank, self.name))
        lens, strides = [], []
        src = 0
        for i in range(rank):
            if i in axes:
                lens.append(1)
                strides.append(0)  # fixed below: any stride is valid for a size-1 axis
            else:
                lens.append(s.lens[src])
                strides.append(s.strides[src])
                src += 1
        # Give each new axis the stride it would have in a packed layout so standard stays standard.
        for i in range(rank - 1, -1, -1):
            if i in axes:
                strides[i] = strides[i + 1] * lens[i + 1] if i + 1 < rank else 1
        return Shape(s.type, lens, strides)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.reshape(args[0], out.lens)


def slice_bounds(start: int, end: int, dim: int) -> tuple[int, int]:
    """ONNX/numpy step-1 bounds: negatives count from the end, then clamp to [0, dim]."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    start = min(max(start, 0), dim)
    end = min(max(end, 0), dim)
    return start, max(start, end)


@register_op
@op_class
class Slice(_View):
    """Step-1 slice of ``axes`` with ONNX clamping (use ``step``/``reverse`` for other steps)."""

    name: ClassVar[str] = "slice"
    axes: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()

    def _bounds(self, s: Shape) -> list[tuple[int, int]]:
        if not len(self.axes) == len(self.starts) == len(self.ends):
            raise ShapeError("slice: axes, starts and ends differ in length")
        b = [(0, n) for n in s.lens]
        for a, st, en in zip(_axes(self.axes, s.ndim(), self.name), self.starts, self.ends, strict=True):
            b[a] = slice_bounds(st, en, s.lens[a])
        return b

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        return Shape(s.type, [e - b for b, e in self._bounds(s)], s.strides)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        return x[tuple(slice(b, e) for b, e in self._bounds(Shape(out.type, x.shape)))]


@register_op
@op_class
class Step(_View):
    """Every ``steps[i]``-th element along ``axes[i]`` starting at 0 (positive steps)."""

    name: ClassVar[str] = "step"
    axes: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if len(self.axes) != len(self.steps) or any(st < 1 for st in self.steps):
            raise ShapeError(f"step: bad steps {list(self.steps)} for axes {list(self.axes)}")
        lens, strides = list(s.lens), list(s.strides)
        for a, st in zip(_axes(self.axes, s.ndim(), self.name), self.steps, strict=True):
            lens[a] = -(-lens[a] // st)
            strides[a] *= st
        return Shape(s.type, lens, strides)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        idx = [slice(None)] * args[0].ndim
        for a, st in zip(self.axes, self.steps, strict=True):
            idx[a] = slice(None, None, st)
        return args[0][tuple(idx)]


@register_op
@op_class
class Broadcast(_View):
    """View the input at ``out_lens``, its dims aligned starting at ``axis`` (MIGraphX ``broadcast``)."""

    name: ClassVar[str] = "broadcast"
    axis: int = 0
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if self.axis < 0 or self.axis + s.ndim() > len(self.out_lens):
            raise ShapeError(f"broadcast: {list(s.lens)} at axis {self.axis} exceeds {list(self.out_lens)}")
        strides = [0] * len(self.out_lens)
        for i, (n, st) in enumerate(zip(s.lens, s.strides, strict=True)):
            o = self.out_lens[self.axis + i]
            if n != o and n != 1:
                raise ShapeError(f"broadcast: dim {n} cannot broadcast to {o}")
            strides[self.axis + i] = st if n == o else 0
        return Shape(s.type, self.out_lens, strides)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        lens = [1] * self.axis + list(x.shape) + [1] * (len(out.lens) - self.axis - x.ndim)
        return np.broadcast_to(x.reshape(lens), out.lens)
