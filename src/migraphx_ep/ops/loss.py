"""Loss ops: negative log-likelihood (SoftmaxCrossEntropyLoss is ``logsoftmax`` + this op)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES, DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes

REDUCTIONS = ("none", "sum", "mean")


@register_op
@op_class
class NllLoss(Op):
    """ONNX NegativeLogLikelihoodLoss on log-probabilities x (N, C, d...) and int target (N, d...).

    loss[n, d] = -x[n, t, d] * w[t] with t = target[n, d] (w = 1 without a weight input); entries whose
    target equals ``ignore_index`` (when ``has_ignore``) contribute 0 and have weight 0. ``mean``
    divides the weighted sum by the sum of the applied weights. Sums run in float32 (float64 for
    double) and round once.
    """

    name: ClassVar[str] = "nll_loss"
    reduction: str = "mean"
    ignore_index: int = 0
    has_ignore: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        c = check_shapes(self.name, inputs).has(2, 3)
        if self.reduction not in REDUCTIONS:
            raise c.fail(f"unknown reduction {self.reduction!r}")
        x, t = inputs[0], inputs[1]
        check_shapes(self.name, [x]).types(FLOAT_TYPES).min_ndims(2)
        check_shapes(self.name, [t]).types({DType.int32_type, DType.int64_type})
        if t.lens != (x.lens[0],) + x.lens[2:]:
            raise ShapeError(f"{self.name}: target {list(t.lens)} does not match input {list(x.lens)}")
        if len(inputs) == 3 and (inputs[2].lens != (x.lens[1],) or inputs[2].type != x.type):
            raise ShapeError(f"{self.name}: weight must be ({x.lens[1]},) of the input's type")
        return Shape(x.type, t.lens if self.reduction == "none" else ())

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, t = args[0], args[1].astype(np.int64)
        acc = np.float64 if x.dtype == np.float64 else np.float32
        c = x.shape[1]
        keep = (t != self.ignore_index) if self.has_ignore else np.ones(t.shape, bool)
        # Ignored (or, undefined by ONNX, out-of-range) targets read class 0; their weight zeroes them.
        tc = np.where(keep, np.clip(t, 0, c - 1), 0)
        picked = np.take_along_axis(x.astype(acc), tc[:, None], axis=1)[:, 0]
        w = args[2].astype(acc)[tc] if len(args) == 3 else np.ones(t.shape, acc)
        w = np.where(keep, w, acc(0))
        loss = np.where(keep, -picked * w, acc(0))
        if self.reduction == "none":
            return loss.astype(out.dtype)
        total = loss.sum(dtype=acc)
        if self.reduction == "mean":
            with np.errstate(all="ignore"):
                total = total / w.sum(dtype=acc)
        return np.asarray(total).astype(out.dtype)
