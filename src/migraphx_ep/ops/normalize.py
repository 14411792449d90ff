"""Softmax family (MIGraphX ``softmax``/``logsoftmax``); the norms decompose into reduce + pointwise ops.

Both subtract the max along ``axis`` first (as every runtime does) so large inputs don't overflow;
narrow floats are evaluated in float32 and rounded once.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes


@op_class
class SoftmaxBase(Op):
    axis: int = 1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(FLOAT_TYPES).min_ndims(1)
        rank = inputs[0].ndim()
        if not -rank <= self.axis < rank:
            raise ShapeError(f"{self.name}: axis {self.axis} out of range for rank {rank}")
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        # Narrow floats step in their own type, rounding after each step as ONNX's definition
        # (and its reference) does; ORT CPU's fp16 kernel differs from that by at most one ulp.
        x = args[0]
        with np.errstate(all="ignore"):
            d = x - np.max(x, axis=self.axis, keepdims=True)
            e = np.exp(d)
            s = np.sum(e, axis=self.axis, keepdims=True)
            r = self.finish(d, e, s)
        return np.ascontiguousarray(r).astype(out.dtype, copy=False)

    def finish(self, d: np.ndarray, e: np.ndarray, s: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@register_op
@op_class
class Softmax(SoftmaxBase):
    name: ClassVar[str] = "softmax"

    def finish(self, d, e, s):
        return e / s


@register_op
@op_class
class Logsoftmax(SoftmaxBase):
    name: ClassVar[str] = "logsoftmax"

    def finish(self, d, e, s):
        return d - np.log(s)
