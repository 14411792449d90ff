"""Ops the frontend core relies on: broadcasting views, layout copies, type conversion, tuples."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .base import elementwise_shape


def broadcast_lens(*all_lens: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcasting of dims; raises ShapeError naming the clash."""
    rank = max(map(len, all_lens), default=0)
    out = []
    for i in range(rank):
        d = 1  # the first dim other than 1 along this axis (every other one must equal it)
        for x in all_lens:
            j = i - rank + len(x)
            if j >= 0 and x[j] != 1:
                if d == 1:
                    d = x[j]
                elif x[j] != d:
                    raise ShapeError(f"dims {[list(x) for x in all_lens]} are not broadcastable")
        out.append(d)
    return tuple(out)


@register_op
@op_class
class Multibroadcast(Op):
    """View the input at ``out_lens`` with zero strides on broadcast axes (numpy rules)."""

    name: ClassVar[str] = "multibroadcast"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if broadcast_lens(s.lens, self.out_lens) != tuple(self.out_lens):
            raise ShapeError(f"multibroadcast: {list(s.lens)} cannot broadcast to {list(self.out_lens)}")
        off = len(self.out_lens) - s.ndim()
        strides = [0] * off + [
            0 if n == 1 and o != 1 else st
            for n, st, o in zip(s.lens, s.strides, self.out_lens[off:], strict=True)
        ]
        return Shape(s.type, self.out_lens, strides)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.broadcast_to(args[0], out.lens)

    def output_alias(self, inputs) -> int:
        return 0


@register_op
@op_class
class Contiguous(Op):
    """Copy a view into a standard (packed, row-major) layout."""

    name: ClassVar[str] = "contiguous"
    cpp: ClassVar[str] = "{0}"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(args[0])


@register_op
@op_class
class Layout(Op):
    """Copy a value into the packed layout whose memory order is ``permutation`` (outermost dim first);
    its dims and elements are unchanged (MIGraphX ``layout``). The gpu target's layout pass puts the
    activations and filters of 2-D convolutions channels-last with it, (0, 2, 3, 1)."""

    name: ClassVar[str] = "layout"
    permutation: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        if sorted(self.permutation) != list(range(s.ndim())):
            raise ShapeError(f"layout: {list(self.permutation)} is not a permutation of {s.ndim()} dims")
        return Shape.from_permutation(s.type, s.lens, self.permutation)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(args[0])  # the same elements: a layout is the target's business


@register_op
@op_class
class DimensionsOf(Op):
    """The dims ``[start, end)`` of its input *as it arrives at run time*, as int64 (MIGraphX
    ``dimensions_of``). The ONNX ``Shape`` of an input with run-time axes (ep/runtime_dims.py) becomes
    this instead of a literal, so one program serves every size of those axes."""

    name: ClassVar[str] = "dimensions_of"
    start: int = 0
    end: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        c = check_shapes(self.name, inputs).has(1)
        if not 0 <= self.start <= self.end <= inputs[0].ndim():
            raise c.fail(f"dims [{self.start}, {self.end}) out of range for rank {inputs[0].ndim()}")
        return Shape(DType.int64_type, (self.end - self.start,))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.asarray(args[0].shape[self.start : self.end], dtype=np.int64).reshape(out.lens)


@register_op
@op_class
class Convert(Op):
    """Element type conversion with ONNX Cast semantics (float→int truncates, NaN→int is 0...)."""

    name: ClassVar[str] = "convert"
    cpp: ClassVar[str] = "{0}"
    target_type: DType = DType.float_type

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "target_type", DType(self.target_type))

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        return elementwise_shape(inputs, self.target_type)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        with np.errstate(all="ignore"):
            if out.type == DType.bool_type:
                return x != 0
            return x.astype(out.dtype)

    def attributes(self) -> dict:
        return {"target_type": int(self.target_type)}


@register_op
@op_class
class GetTupleElem(Op):
    name: ClassVar[str] = "get_tuple_elem"
    index: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        if len(inputs) != 1 or inputs[0].type != DType.tuple_type:
            raise ShapeError("get_tuple_elem: expects one tuple input")
        if not 0 <= self.index < len(inputs[0].sub_shapes):
            raise ShapeError(f"get_tuple_elem: index {self.index} out of range")
        return inputs[0].sub_shapes[self.index]

    def compute(self, out: Shape, args: list) -> np.ndarray:
        return args[0][self.index]

    def output_alias(self, inputs) -> int:
        return 0
